"""graft-dapo: DAPO's shaping of each RL step's batch, dynamic sampling and the overlong filter
or penalty (entry point ``dapo``, section ``features.dapo``, `DapoConfig`).

- `graft_dapo.plugin`: where the plugin touches Graft's core (its section, its config rule and
  ``graft_batch_shaper``);
- `graft_dapo.shaping`: `DapoShaper`, the `graft.rl.BatchShaper` each RL step's experience goes
  through, and the pure functions it applies (`overlong_penalty`, `flat_groups`,
  `plan_groups`, `take_groups`, `masked`).

Importing this package is cheap (no torch).
"""

from graft_dapo.config import DapoConfig
from graft_dapo.shaping import (
    DapoShaper,
    flat_groups,
    masked,
    overlong_penalty,
    plan_groups,
    take_groups,
)

__version__ = "0.1.0"

__all__ = ["DapoConfig", "DapoShaper", "__version__", "flat_groups", "masked",
           "overlong_penalty", "plan_groups", "take_groups"]
