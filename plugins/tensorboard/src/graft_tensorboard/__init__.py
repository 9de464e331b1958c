"""graft-tensorboard: every step's metrics as TensorBoard scalars in ``<run_dir>/tensorboard``
(entry point ``tensorboard``, section ``features.tensorboard``, `TensorBoardConfig`).

- `graft_tensorboard.plugin`: where the plugin touches Graft's core (its section, the pre-flight
  check, ``graft_train_begin``, ``graft_step_end`` and ``graft_train_end``);
- `graft_tensorboard.events`: `TensorBoardEvents`, the event files of one Graft run, the steps
  done again after a resume superseded.

Importing this package is cheap (tensorboard loads when a run logs).
"""

from graft_tensorboard.config import TensorBoardConfig
from graft_tensorboard.events import EVENTS_DIR, TensorBoardEvents

__version__ = "0.1.0"

__all__ = ["EVENTS_DIR", "TensorBoardConfig", "TensorBoardEvents", "__version__"]
