"""Claims the plugin name 'demo' too."""

from graft import hookimpl


@hookimpl
def graft_step_begin(step):
    pass
