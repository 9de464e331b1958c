"""Only the selected module instances are routed through the offloader."""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from graft_offload.patching import offload_subclass, routed_offloader
from graft_offload.standin import DeferredCopyBackend


def test_only_the_selected_instances_change_class(build_llama, offload) -> None:
    model, other = build_llama(), build_llama()
    layers = model.model.layers
    offloader = offload(torch.nn.ModuleList([layers[1], layers[2]]), DeferredCopyBackend())
    assert [type(layer) is LlamaDecoderLayer for layer in layers] == [True, False, False, True]
    assert all(type(layer) is LlamaDecoderLayer for layer in other.model.layers)
    assert [routed_offloader(layer) for layer in layers] == [None, offloader, offloader, None]
    patched = type(layers[1])
    assert patched is type(layers[2]) and issubclass(patched, LlamaDecoderLayer)
    assert (patched.__name__, patched.__qualname__) == ("LlamaDecoderLayer", "LlamaDecoderLayer")
    assert offload_subclass(patched) is patched


def test_a_module_is_offloaded_once(build_llama, offload) -> None:
    layers = build_llama().model.layers
    offload(layers, DeferredCopyBackend())
    with pytest.raises(ValueError, match="already has its inputs offloaded"):
        offload(layers, DeferredCopyBackend())


def test_removing_the_offload_restores_the_classes(build_llama, offload) -> None:
    from graft_offload.runtime import remove_offload

    layers = build_llama().model.layers
    offloader = offload(layers, DeferredCopyBackend())
    remove_offload(list(layers), offloader)
    assert all(type(layer) is LlamaDecoderLayer for layer in layers)
    assert all(routed_offloader(layer) is None for layer in layers)


def test_fsdp2_class_swap_keeps_the_routing(build_llama, offload) -> None:
    from torch.distributed.fsdp import fully_shard

    from graft.engine.distributed.env import init_distributed

    env = init_distributed(device_preference="cpu")
    model = build_llama()
    offloader = offload(model.model.layers, DeferredCopyBackend())
    for layer in model.model.layers:
        fully_shard(layer, mesh=env.mesh)
    layer = model.model.layers[0]
    assert type(layer).__name__.startswith("FSDP") and routed_offloader(layer) is offloader
    assert isinstance(layer, LlamaDecoderLayer)
