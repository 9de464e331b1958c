"""Per-token policy losses built into the core: PPO clip with dual clip (SFT's NLL is
`graft.training.sft.sft_loss`), and the KL penalty against a frozen reference that RL adds.

All functions take ``(num_sequences, max_len)`` fp32 tensors and return ``(loss_mat, metrics)``;
``metrics`` are per-token tensors the trainer averages over the mask.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from graft.losses.contract import token_separable

if TYPE_CHECKING:
    import torch

LOG_RATIO_CLAMP = 20.0


@token_separable
def ppo_clip_loss(*, logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                  mask: torch.Tensor, cfg: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped surrogate with asymmetric clip range and dual clip (Ye et al., 2020).

    ``ratio = exp(logp - old_logp)``; ``loss = max(-A r, -A clip(r, 1 - low, 1 + high))``; for
    ``A < 0`` the loss is further capped at ``-A c`` (``cfg.clip_ratio_c``, None disables).
    """
    import torch

    log_ratio = (logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - cfg.clip_ratio_low, 1.0 + cfg.clip_ratio_high)
    loss = torch.maximum(unclipped, clipped)
    metrics = {"clip_fraction": (clipped > unclipped).float(),
               "approx_kl": -log_ratio.detach()}
    if cfg.clip_ratio_c is not None:
        floor = -advantages * cfg.clip_ratio_c
        dual = torch.minimum(loss, floor)
        metrics["dual_clip_fraction"] = ((advantages < 0) & (floor < loss)).float()
        loss = torch.where(advantages < 0, dual, loss)
    return loss, metrics


# Per-token KL penalties between the policy and a frozen reference (``loss.kl_type``).
# low_var_kl only: the log-ratio going into exp() is clamped to +-EXPONENT_CLAMP (exp(20) is
# finite in every float type the trainer uses) and the penalty to [0, PENALTY_CLAMP], as verl
# does. k1 and k2 are polynomials of the log-ratio and are not clamped.
EXPONENT_CLAMP = 20.0
PENALTY_CLAMP = 10.0


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from log-probs of the sampled tokens.

    * ``kl``: ``logp - ref`` (k1), unclamped;
    * ``mse``: ``0.5 (logp - ref)^2`` (k2), unclamped;
    * ``low_var_kl``: ``exp(d) - d - 1`` with ``d = ref - logp`` clamped to +-20 (k3, Schulman;
      non-negative and unbiased), the result clamped to at most 10.
    """
    diff = ref_logp - logp
    if kind == "kl":
        return -diff
    if kind == "mse":
        return 0.5 * diff.square()
    if kind == "low_var_kl":
        clamped = diff.clamp(-EXPONENT_CLAMP, EXPONENT_CLAMP)
        return (clamped.exp() - clamped - 1).clamp(-PENALTY_CLAMP, PENALTY_CLAMP)
    raise ValueError(f"unknown kl_type {kind!r}")
