"""graft-wandb: every step's metrics and the run's config to Weights & Biases (entry point
``wandb``, section ``features.wandb``, `WandbConfig`).

- `graft_wandb.plugin`: where the plugin touches Graft's core (its section, the pre-flight
  check, ``graft_train_begin``, ``graft_step_end`` and ``graft_train_end``);
- `graft_wandb.logger`: `WandbLogger`, the W&B run of one Graft run, continued on a resume.

Importing this package is cheap (wandb loads when a run logs).
"""

from graft_wandb.config import WandbConfig
from graft_wandb.logger import STATE_FILE, WandbLogger

__version__ = "0.1.0"

__all__ = ["STATE_FILE", "WandbConfig", "WandbLogger", "__version__"]
