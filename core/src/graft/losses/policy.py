"""Per-token policy losses built into the core: PPO clip with dual clip (SFT's NLL is
`graft.training.sft.sft_loss`).

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
