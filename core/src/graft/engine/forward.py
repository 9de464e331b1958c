"""One micro-batch through the model: per-token log-probabilities (and entropy) in the grid."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from graft.engine.batch.micro_batch import MicroBatch
from graft.engine.head.chunked import chunked_head_logprobs
from graft.engine.head.fused_loss import GradientRunner, TokenLoss, fused_head_loss
from graft.engine.head.logprobs import token_entropy, token_logprobs
from graft.models.family import ModelFamily


def forward_logprobs(model: torch.nn.Module, family: ModelFamily, batch: MicroBatch, *,
                     compute_dtype: torch.dtype, with_entropy: bool = False,
                     chunk_tokens: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probability of every label, ``(R, L)`` fp32, and optionally the entropy.

    ``compute_dtype`` is the dtype the model computes in (bf16 under mixed precision); masks
    built for packed rows use it. ``chunk_tokens`` (``engine.logprob_chunk_tokens``) > 0 never
    forms the ``tokens x vocab`` logits: the model's head runs on that many tokens at a time
    (`graft.engine.head.chunked`); 0 takes the whole logits from the model.
    """
    t = batch.tensors
    if chunk_tokens > 0:
        return chunked_head_logprobs(output_head(model),
                                     _last_hidden(model, family, batch, compute_dtype),
                                     t["labels"], t["temperature"], chunk_tokens=chunk_tokens,
                                     with_entropy=with_entropy,
                                     params=head_parameters(model))
    logits = model(**_model_inputs(model, family, batch, compute_dtype)).logits
    logp = token_logprobs(logits, t["labels"], t["temperature"])
    entropy = token_entropy(logits, t["temperature"]) if with_entropy else None
    return logp, entropy


def forward_fused_loss(model: torch.nn.Module, family: ModelFamily, batch: MicroBatch,
                       token_loss: TokenLoss, *, compute_dtype: torch.dtype,
                       with_entropy: bool = False, chunk_tokens: int,
                       gradient: GradientRunner | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """`forward_logprobs` with the loss's gradient taken in the chunked head
    (`graft.engine.head.fused_loss`): the log-probs and entropy (detached, the same values)
    and the micro-batch's loss, ``token_loss`` summed over every token, whose backward carries
    the gradients. ``chunk_tokens`` must be > 0; ``gradient`` runs each chunk's gradient
    (the trainer's: inside the plugins' ``graft_compute``, step ``gradient``)."""
    t = batch.tensors
    return fused_head_loss(output_head(model), _last_hidden(model, family, batch, compute_dtype),
                           t["labels"], t["temperature"], token_loss, chunk_tokens=chunk_tokens,
                           with_entropy=with_entropy, params=head_parameters(model),
                           gradient=gradient)


def _last_hidden(model: torch.nn.Module, family: ModelFamily, batch: MicroBatch,
                 compute_dtype: torch.dtype) -> torch.Tensor:
    """The model's forward on ``batch`` up to its output head: the hidden states the head
    would turn into logits."""
    with head_inputs(model) as captured:
        model(**_model_inputs(model, family, batch, compute_dtype))
    return captured["hidden"]


def _model_inputs(model: torch.nn.Module, family: ModelFamily, batch: MicroBatch,
                  compute_dtype: torch.dtype) -> dict[str, Any]:
    t = batch.tensors
    mask = None
    if family.packs_sequences:
        mask = family.packed_attention_mask(model.config, t["position_ids"], compute_dtype)
    return dict(input_ids=t["input_ids"], position_ids=t["position_ids"], attention_mask=mask,
                use_cache=False)


@contextmanager
def head_inputs(model: torch.nn.Module) -> Iterator[dict[str, torch.Tensor]]:
    """Within the block, the model's forward hands its output head zero positions and the dict
    yielded gets ``hidden``: the hidden states the head would have turned into logits.

    Everything before the head runs as usual, inside the model's own ``forward`` (and so
    inside FSDP2's hooks of the root module, which keep the head's weights gathered after it).
    """
    captured: dict[str, torch.Tensor] = {}

    def take(module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        hidden = args[0]
        captured["hidden"] = hidden
        return (hidden[..., :0, :], *args[1:])

    handle = model.get_output_embeddings().register_forward_pre_hook(take)
    try:
        yield captured
    finally:
        handle.remove()
    if "hidden" not in captured:
        raise RuntimeError(f"{type(model).__name__}'s forward never called its output head "
                           f"(get_output_embeddings()); set engine.logprob_chunk_tokens=0")


def output_head(model: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """The function the model applies to its last hidden states: its output embeddings, then
    the final logit soft-capping of models that have one (``cap * tanh(logits / cap)``)."""
    head = model.get_output_embeddings()
    cap = getattr(model.config, "final_logit_softcapping", None)
    if not cap:
        return head
    return lambda hidden: torch.tanh(head(hidden) / cap) * cap


def head_parameters(model: torch.nn.Module) -> list[torch.Tensor]:
    """The output head's parameters that train (tied embeddings included), for their gradients."""
    if not torch.is_grad_enabled():
        return []
    return [p for p in model.get_output_embeddings().parameters() if p.requires_grad]
