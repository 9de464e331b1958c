"""graft-router-replay: MoE routing record/replay for Graft (entry point ``router_replay``).

Names other code may use (loaded on first access: importing the plugin stays free of torch):
the batch keys routes travel under (``ROUTES``, ``VALID``) and the engine-output normaliser
(``ingest_routes``).
"""

from graft import lazy_attributes

__version__ = "0.1.0"

_LAZY = {
    "ROUTES": "graft_router_replay.routes",
    "VALID": "graft_router_replay.routes",
    "ingest_routes": "graft_router_replay.ingest",
}

__all__ = ["__version__", *_LAZY]


__getattr__ = lazy_attributes(__name__, _LAZY)
