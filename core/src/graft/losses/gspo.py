"""GSPO (Group Sequence Policy Optimization, Zheng et al., 2025), ``loss.policy_loss=gspo``: a
per-token policy loss that honours every ``loss.loss_agg_mode``.

Sequence ratio ``s_i = exp(mean over the valid tokens of (logp - old_logp))``, in token form
``log s_it = sg[log s_i] + logp_t - sg[logp_t]`` (clamped at ``LOG_RATIO_CLAMP``): every token's
value is ``s_i`` but each keeps its own gradient ``s_i * grad logp_t``. The per-token loss is
``max(-A s_it, -A clip(s_it, 1 - low, 1 + high))`` (``loss.clip_ratio_low/high``; GSPO's ranges
are ~3e-4 / 4e-4), times the optional rollout importance weights (``loss.gspo_rollout_is``). The
core then reduces it with ``loss.loss_agg_mode``: ``seq-mean-token-mean`` gives the GSPO paper's
objective; the other modes weight sequences by their length or a constant, as they do for PPO
(verl's GSPO ignores the configured mode and always uses ``seq-mean-token-mean``). Like verl's
``compute_policy_loss_gspo``, GSPO has no dual clip: ``loss.clip_ratio_c`` set with it is a config
error (`check_gspo_config`), not a setting silently ignored.

Metrics (per token, averaged over the mask): ``clip_fraction`` and its ``_lower`` (A < 0, ratio
below 1 - low) and ``_upper`` (A > 0, ratio above 1 + high) parts, ``seq_ratio``, ``approx_kl``
and, with rollout importance weights, ``rollout_is_weight``.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from functools import cache
from typing import TYPE_CHECKING, Any

from graft.config.keys import was_set
from graft.errors import ConfigError

if TYPE_CHECKING:  # torch loads when the loss runs: config validation imports this module
    import torch

LOG_RATIO_CLAMP = 10.0
PPO_LIKE_CLIP = 0.01  # clip ranges above this look like PPO's token-ratio ranges

logger = logging.getLogger("graft.losses")


def gspo_loss(*, logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
              mask: torch.Tensor, cfg: Any,
              tensors: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO's per-token loss over ``(sequences, tokens)`` matrices (see the module docstring);
    ``cfg`` is ``cfg.loss``, ``tensors`` holds ``rollout_logprobs`` for the importance weights."""
    import torch

    warn_if_ppo_clip_range(cfg.clip_ratio_low, cfg.clip_ratio_high)
    log_ratio = sequence_log_ratio(logp, old_logp, mask)
    token_log_ratio = (log_ratio.detach()[:, None] + logp - logp.detach()).clamp(
        max=LOG_RATIO_CLAMP)
    ratio = torch.exp(token_log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - cfg.clip_ratio_low, 1.0 + cfg.clip_ratio_high)
    loss = torch.maximum(unclipped, clipped)
    took_clip = (clipped > unclipped).float()
    metrics = {"clip_fraction": took_clip,
               "clip_fraction_lower": took_clip * (advantages < 0).float(),
               "clip_fraction_upper": took_clip * (advantages > 0).float(),
               "seq_ratio": ratio.detach(),
               "approx_kl": -log_ratio.detach()[:, None].expand_as(logp)}
    if cfg.gspo_rollout_is != "none":
        weights = rollout_is_weights(old_logp, tensors["rollout_logprobs"], mask,
                                     level=cfg.gspo_rollout_is, cap=cfg.gspo_rollout_is_cap)
        loss = loss * weights
        metrics["rollout_is_weight"] = weights
    return loss, metrics


def sequence_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor,
                       mask: torch.Tensor) -> torch.Tensor:
    """``log s_i``: the mean of ``logp - old_logp`` over each sequence's valid tokens ``(S,)``
    (0 for a sequence without any)."""
    import torch

    diff = torch.where(mask != 0, (logp - old_logp) * mask, 0.0)
    return diff.sum(-1) / mask.sum(-1).clamp(min=1.0)


def rollout_is_weights(old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, *,
                       level: str, cap: float) -> torch.Tensor:
    """Truncated importance weights of the trainer's policy over the rollout engine's, detached:
    per token ``min(exp(old - rollout), cap)``, or per sequence (``level="sequence"``) the
    geometric mean over its tokens, like GSPO's own ratio; ``(S, T)``."""
    import torch

    log_weight = torch.where(mask != 0, old_logp - rollout_logp, 0.0).detach()
    if level == "sequence":
        log_weight = (log_weight.sum(-1) / mask.sum(-1).clamp(min=1.0))[:, None].expand_as(mask)
    return torch.exp(log_weight.clamp(max=LOG_RATIO_CLAMP)).clamp(max=cap)


def gspo_default_has_no_dual_clip(cfg: Any, user_keys: Collection[str]) -> None:
    """A config rule: ``loss.policy_loss=gspo`` turns the default ``loss.clip_ratio_c`` off (GSPO
    has no dual clip); a value the user set stays and `check_gspo_config` refuses it."""
    if cfg.loss.policy_loss == "gspo" and not was_set("loss.clip_ratio_c", user_keys):
        cfg.loss.clip_ratio_c = None


def check_gspo_config(cfg: Any) -> None:
    """`ConfigError` for ``loss.policy_loss=gspo`` with ``loss.clip_ratio_c`` set: GSPO (as in
    verl) has no dual clip, so the setting would be silently ignored."""
    loss = cfg.loss
    if loss.policy_loss != "gspo" or loss.clip_ratio_c is None:
        return
    raise ConfigError(f"loss.policy_loss=gspo has no dual clip, so loss.clip_ratio_c="
                      f"{loss.clip_ratio_c} would be ignored (GSPO clips its sequence ratio to "
                      f"[1 - clip_ratio_low, 1 + clip_ratio_high] only, as verl's GSPO does); "
                      f"set loss.clip_ratio_c=null")


@cache
def warn_if_ppo_clip_range(low: float, high: float) -> None:
    """Warn once per clip range when it looks like PPO's (0.2 / 0.28): a sequence ratio, the
    exponential of a mean log-ratio, almost never leaves such a range, so nothing is clipped."""
    if low > PPO_LIKE_CLIP or high > PPO_LIKE_CLIP:
        logger.warning("loss.policy_loss=gspo with loss.clip_ratio_low=%g, clip_ratio_high=%g: "
                       "these look like PPO's token-ratio ranges; GSPO's sequence ratio rarely "
                       "leaves them, so its clipping is inactive. The GSPO paper uses 3e-4 and "
                       "4e-4 (loss.clip_ratio_low=3e-4 loss.clip_ratio_high=4e-4).", low, high)
