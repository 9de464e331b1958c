"""Group-relative advantages: GRPO (optionally without the std, Dr. GRPO) and RLOO.

Rewards come in groups of ``n`` samples of the same prompt, consecutive.
"""

from __future__ import annotations

import torch

EPS = 1e-6


def group_advantages(rewards: torch.Tensor, n: int, *, estimator: str,
                     norm_by_std: bool = True) -> torch.Tensor:
    """One advantage per sample.

    * ``grpo``: ``(r - mean_group) / (std_group + eps)``, or ``r - mean_group`` when
      ``norm_by_std`` is false (Dr. GRPO).
    * ``rloo``: ``r - mean of the other n - 1 samples`` = ``n / (n - 1) * (r - mean_group)``.
    """
    groups = rewards.float().reshape(-1, n)
    centred = groups - groups.mean(dim=1, keepdim=True)
    if estimator == "grpo":
        out = centred / (groups.std(dim=1, keepdim=True) + EPS) if norm_by_std and n > 1 else centred
    elif estimator == "rloo":
        out = centred * n / (n - 1) if n > 1 else torch.zeros_like(centred)
    else:
        raise ValueError(f"unknown advantage estimator {estimator!r}")
    return out.reshape(-1)
