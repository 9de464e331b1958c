"""graft-offload: asynchronous activation offload of checkpoint-boundary inputs (entry point
``offload``).

Importing this package is cheap (no torch); the torch-level names load on first access:
`apply_offload` (offload chosen modules of a model by hand), `Offloader`, `use_copy_backend`
(put a copy backend, such as the CPU stand-in `DeferredCopyBackend`, in place of CUDA),
`StandInRace` (what the stand-in raises for a copy queued out of order).
"""

from graft import lazy_attributes
from graft_offload.config import OffloadConfig

__version__ = "0.1.0"

__all__ = ["DeferredCopyBackend", "OffloadConfig", "Offloader", "StandInRace", "__version__",
           "apply_offload", "use_copy_backend"]

_LAZY = {
    "apply_offload": "graft_offload.runtime",
    "use_copy_backend": "graft_offload.runtime",
    "Offloader": "graft_offload.offloader",
    "DeferredCopyBackend": "graft_offload.standin",
    "StandInRace": "graft_offload.standin",
}


__getattr__ = lazy_attributes(__name__, _LAZY)
