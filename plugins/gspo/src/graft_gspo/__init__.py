"""graft-gspo: GSPO, the sequence-ratio policy loss ``loss.policy_loss=gspo`` (entry point
``gspo``, section ``features.gspo``, `GspoConfig`).

- `graft_gspo.plugin`: where the plugin touches Graft's core (its section, its config rules and
  ``graft_policy_losses``);
- `graft_gspo.config`: `GspoConfig` and the rules (`check_gspo_config`,
  `gspo_default_has_no_dual_clip`);
- `graft_gspo.loss`: `gspo_loss` and the pure functions it is built from
  (`sequence_log_ratio`, `rollout_is_weights`, `warn_if_ppo_clip_range`).

Importing this package is cheap (no torch).
"""

from graft_gspo.config import GspoConfig, check_gspo_config, gspo_default_has_no_dual_clip
from graft_gspo.loss import gspo_loss, rollout_is_weights, sequence_log_ratio, warn_if_ppo_clip_range

__version__ = "0.1.0"

__all__ = ["GspoConfig", "__version__", "check_gspo_config", "gspo_default_has_no_dual_clip",
           "gspo_loss", "rollout_is_weights", "sequence_log_ratio", "warn_if_ppo_clip_range"]
