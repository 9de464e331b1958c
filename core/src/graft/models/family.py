"""`ModelFamily`: what the core needs to know about one Hugging Face ``model_type``.

A family is plain data plus a few small functions; the core ships families for the model types in
`graft.models.builtin`, and plugins add or replace families through ``graft_model_families``.
Everything has a default that works for the standard ``*ForCausalLM`` layout
(``model.model.layers`` of decoder blocks, ``model.lm_head``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig


def standard_decoder_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder blocks of a standard ``*ForCausalLM``: ``model.model.layers``."""
    return list(model.get_decoder().layers)


def no_packed_mask(config: PretrainedConfig, position_ids: torch.Tensor, dtype: torch.dtype) -> Any:
    """Let transformers detect packed sequences from ``position_ids`` (no explicit mask)."""
    return None


@dataclass(frozen=True)
class ModelFamily:
    """How Graft builds, lays out, shards and exports one Hugging Face ``model_type``.

    Attributes:
        model_type: the Hugging Face ``config.model_type`` this family handles.
        presets: random-init presets, name -> ``f(**overrides) -> PretrainedConfig`` (the user's
            ``model.overrides`` are passed in, so derived fields follow them).
        decoder_blocks: the model's decoder blocks, in forward order (the units of FSDP2
            sharding, activation checkpointing and activation offload).
        packs_sequences: True when several samples can share one row (positions restart per
            sample and attention stays within a sample). False makes every sample its own row.
        packed_attention_mask: the ``attention_mask`` argument for a packed row (None lets
            transformers derive it from ``position_ids``; a dict of per-layer-type masks for
            models whose mask code ignores ``position_ids``).
        left_padding_exact: True when a prompt left-padded in a batch of longer ones gives the
            outputs it gives alone (the attention mask hides the pad). False makes the embedded
            rollout generate prompts of one length together (DeepSeek-V4's compressor and
            indexer ignore the mask).
        init_weights: called after a random init (presets) to give buffers sensible values.
        prepare_model: called on every model built for this family (presets, checkpoints,
            the KL reference, inference copies), right after construction: family-level fixes
            that must hold whatever the weights (hooks on transformers modules, say).
        router_modules: the MoE router modules in layer order (routing replay); None for dense.
        routing_weights: ``f(router, logits, ids) -> weights``: the weights ``router`` gives the
            experts ``ids`` ``(T, k)`` from its logits ``(T, E)`` (its forward's first output),
            with the family's own normalisation; a plugin that imposes the experts (routing
            replay) recomputes the weights with it, so gradients still reach the router. None
            where nobody needs it.
        static_routing: ``f(router) -> bool``: True for a router whose choice of experts does
            not depend on learned weights (DeepSeek-V4's hash routers pick by token id): it is
            deterministic, so routing replay skips it while keeping every layer's position.
            None: every router is learned.
        parallelize: ``f(model, family, *, cfg, mesh, device, role, meshes) -> model``
            replacing `graft.engine.distributed.parallelize.parallelize_standard` (e.g. to add expert
            parallelism); compose the ``apply_*`` helpers of that module, and call
            ``apply_pre_shard_hooks`` (with ``role`` and ``meshes``) after activation
            checkpointing and before ``fully_shard`` (checked). The model arrives on
            ``device``; ``mesh`` is the data-parallel mesh, ``meshes`` the run's
            `graft.engine.distributed.parallel_dims.ParallelMeshes` (``meshes["ep"]``,
            ``meshes["efsdp"]``). It may take any subset of the keyword arguments.
        expert_parallel: True when ``parallelize`` implements ``engine.ep_size > 1`` (experts
            split over ``meshes["ep"]``, see `graft.engine.distributed.expert_parallel`); ``ep_size > 1`` is a
            config error for other families.
        extras: free-form data for plugins (EP layouts, adapters), keyed by plugin name.
    """

    model_type: str
    presets: dict[str, Callable[..., PretrainedConfig]] = field(default_factory=dict)
    decoder_blocks: Callable[[torch.nn.Module], Sequence[torch.nn.Module]] = standard_decoder_blocks
    packs_sequences: bool = True
    packed_attention_mask: Callable[[PretrainedConfig, torch.Tensor, torch.dtype], Any] = no_packed_mask
    left_padding_exact: bool = True
    init_weights: Callable[[torch.nn.Module, int], None] | None = None
    prepare_model: Callable[[torch.nn.Module], None] | None = None
    router_modules: Callable[[torch.nn.Module], Sequence[torch.nn.Module]] | None = None
    routing_weights: Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    static_routing: Callable[[torch.nn.Module], bool] | None = None
    parallelize: Callable[..., torch.nn.Module] | None = None
    expert_parallel: bool = False
    extras: dict[str, Any] = field(default_factory=dict)
