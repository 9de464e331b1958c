"""graft-offload-standin-plugin: graft-offload's CPU stand-in in a ``graft train`` process."""
