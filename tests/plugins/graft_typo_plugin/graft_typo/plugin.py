"""A plugin whose author misspelled graft_pre_shard."""

from graft import hookimpl


@hookimpl
def graft_pre_shrad(model, cfg, mesh):
    raise AssertionError("never called")
