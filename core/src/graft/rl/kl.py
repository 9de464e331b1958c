"""Per-token KL penalties between the policy and a frozen reference (``loss.kl_type``)."""

from __future__ import annotations

import torch

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
        return (torch.exp(clamped) - clamped - 1).clamp(-PENALTY_CLAMP, PENALTY_CLAMP)
    raise ValueError(f"unknown kl_type {kind!r}")
