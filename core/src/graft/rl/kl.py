"""Per-token KL penalties between the policy and a frozen reference (``loss.kl_type``)."""

from __future__ import annotations

import torch

CLAMP = 20.0


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from log-probs of the sampled tokens.

    * ``kl``: ``logp - ref`` (k1); * ``mse``: ``0.5 (logp - ref)^2`` (k2);
    * ``low_var_kl``: ``exp(ref - logp) - (ref - logp) - 1`` (k3, Schulman), clamped to [-10, 10]
      as verl does, non-negative and unbiased.
    """
    diff = (ref_logp - logp).clamp(-CLAMP, CLAMP)
    if kind == "kl":
        return -diff
    if kind == "mse":
        return 0.5 * diff.square()
    if kind == "low_var_kl":
        return (torch.exp(diff) - diff - 1).clamp(-10.0, 10.0)
    raise ValueError(f"unknown kl_type {kind!r}")
