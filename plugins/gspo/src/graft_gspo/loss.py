"""GSPO's per-token policy loss (Group Sequence Policy Optimization, Zheng et al., 2025),
``loss.policy_loss=gspo``, and the pure functions it is built from (hand-checked in
tests/gspo/test_loss.py). torch is imported where the math runs: config validation imports
this package.

Per token ``max(-A s_it, -A clip(s_it, 1 - low, 1 + high))``, where ``s_it`` has the value of
the sequence ratio ``s_i = exp(mean over the valid tokens of (logp - old_logp))`` and the
gradient ``s_i * grad logp_t``; the core reduces it with ``loss.loss_agg_mode``.
plugins/gspo/README.md ("How it works") says why, and what each mode then means.
"""

from __future__ import annotations

import logging
from functools import cache
from typing import TYPE_CHECKING, Any

from graft_gspo.config import gspo_section

if TYPE_CHECKING:
    import torch

# Largest token log-ratio (and rollout-weight log-ratio): exp(10) stays finite in fp32 and lies
# far outside any clip range; a token above it gets no gradient rather than an inf.
LOG_RATIO_CLAMP = 10.0
PPO_LIKE_CLIP = 0.01  # clip ranges above this look like PPO's token-ratio ranges

logger = logging.getLogger("graft.losses")  # the core's loss logger: its warnings show as before


def gspo_loss(*, logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
              mask: torch.Tensor, cfg: Any, root_cfg: Any = None,
              tensors: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO's per-token loss and per-token metrics over ``(sequences, tokens)`` matrices (the
    ``graft_policy_losses`` contract; called by the trainer for every micro-batch).

    ``logp``/``old_logp``: the trained and the old policy's log-probs (nats); ``advantages``
    per token; ``mask`` 1 on the response tokens. ``cfg`` is ``cfg.loss`` (its
    ``clip_ratio_low/high``), ``root_cfg`` the whole config (``features.gspo``'s rollout
    weights; None or a config without the section: none), ``tensors`` holds
    ``rollout_logprobs`` for those weights. The loss is not token-separable: a token's value
    depends on its whole sequence's ratio."""
    import torch

    gspo = gspo_section(root_cfg)
    warn_if_ppo_clip_range(cfg.clip_ratio_low, cfg.clip_ratio_high)
    log_ratio = sequence_log_ratio(logp, old_logp, mask)
    # every token's value is the sequence ratio, but each keeps its own gradient s_i * grad logp_t
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
    if gspo.rollout_is != "none":
        weights = rollout_is_weights(old_logp, tensors["rollout_logprobs"], mask,
                                     level=gspo.rollout_is, cap=gspo.rollout_is_cap)
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


@cache
def warn_if_ppo_clip_range(low: float, high: float) -> None:
    """Warn once per clip range when it looks like PPO's (0.2 / 0.28): a sequence ratio, the
    exponential of a mean log-ratio, almost never leaves such a range, so nothing is clipped."""
    if low > PPO_LIKE_CLIP or high > PPO_LIKE_CLIP:
        logger.warning("loss.policy_loss=gspo with loss.clip_ratio_low=%g, clip_ratio_high=%g: "
                       "these look like PPO's token-ratio ranges; GSPO's sequence ratio rarely "
                       "leaves them, so its clipping is inactive. The GSPO paper uses 3e-4 and "
                       "4e-4 (loss.clip_ratio_low=3e-4 loss.clip_ratio_high=4e-4).", low, high)
