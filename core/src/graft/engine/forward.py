"""One micro-batch through the model: per-token log-probabilities (and entropy) in the grid."""

from __future__ import annotations

import torch

from graft.engine.logprobs import token_entropy, token_logprobs
from graft.engine.micro_batch import MicroBatch
from graft.models.family import ModelFamily


def forward_logprobs(model: torch.nn.Module, family: ModelFamily, batch: MicroBatch, *,
                     compute_dtype: torch.dtype,
                     with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probability of every label, ``(R, L)`` fp32, and optionally the entropy.

    ``compute_dtype`` is the dtype the model computes in (bf16 under mixed precision); masks
    built for packed rows use it.
    """
    t = batch.tensors
    mask = None
    if family.packs_sequences:
        mask = family.packed_attention_mask(model.config, t["position_ids"], compute_dtype)
    logits = model(input_ids=t["input_ids"], position_ids=t["position_ids"], attention_mask=mask,
                   use_cache=False).logits
    logp = token_logprobs(logits, t["labels"], t["temperature"])
    entropy = token_entropy(logits, t["temperature"]) if with_entropy else None
    return logp, entropy
