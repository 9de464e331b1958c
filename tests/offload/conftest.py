"""Fixtures for graft-offload's tests: small real models and a training loop that records the
loss and every gradient, run on the CPU stand-in for the device (`DeferredCopyBackend`).

Test modules reach these helpers through the fixtures at the end (pytest imports test files
in importlib mode, where conftest is not importable).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial

import pytest
import torch
from torch.utils.checkpoint import checkpoint
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.modeling_layers import GradientCheckpointingLayer

from graft.engine import apply_activation_checkpointing
from graft_offload.offloader import Offloader
from graft_offload.runtime import apply_offload, remove_offload
from graft_offload.standin import DeferredCopyBackend

CPU = torch.device("cpu")


class Block(GradientCheckpointingLayer):
    """A residual block checkpointed by transformers' own wrapper, like a decoder layer."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(width, width)

    def forward(self, hidden_states: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return hidden_states + scale * torch.tanh(self.linear(hidden_states))


class Stack(torch.nn.Module):
    """``layers`` of `Block`, called with the input positionally or (``keyword=True``) as
    ``hidden_states=``; ``output_hooks`` are registered on each block's output."""

    def __init__(self, blocks: int = 4, width: int = 16, *, keyword: bool = False) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(Block(width) for _ in range(blocks))
        self.keyword = keyword
        self.output_hooks: list[Callable[[int], None]] = []
        for layer in self.layers:
            layer.gradient_checkpointing = True
            layer._gradient_checkpointing_func = partial(checkpoint, use_reentrant=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for index, layer in enumerate(self.layers):
            x = layer(hidden_states=x) if self.keyword else layer(x)
            for hook in self.output_hooks:
                if x.requires_grad:
                    x.register_hook(lambda grad, i=index, h=hook: h(i))
        return x


def tiny_llama(layers: int = 4, seed: int = 0, every_blocks: int = 1) -> torch.nn.Module:
    """A real transformers Llama (hidden 64) with the core's non-reentrant activation
    checkpointing: transformers' own wrapper, or checkpoints of ``every_blocks`` blocks."""
    config = AutoConfig.for_model("llama", hidden_size=64, intermediate_size=128, vocab_size=100,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                  num_hidden_layers=layers, use_cache=False)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    apply_activation_checkpointing(model, every_blocks=every_blocks, blocks=model.model.layers)
    return model.train()


@dataclass
class Run:
    """Losses and gradients of each step, and the offload's metrics and host allocations."""

    losses: list[torch.Tensor] = field(default_factory=list)
    grads: list[dict[str, torch.Tensor]] = field(default_factory=list)
    metrics: list[dict[str, float]] = field(default_factory=list)
    host_allocations: list[int] = field(default_factory=list)


def llama_steps(model: torch.nn.Module, steps: int = 3, offloader: Offloader | None = None,
                backend: DeferredCopyBackend | None = None, tokens: int = 24) -> Run:
    """``steps`` of forward, backward and SGD on fixed random batches of 2 x ``tokens``,
    recording everything."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1)
    run = Run()
    for _ in range(steps):
        if offloader is not None:
            offloader.begin_step()
        ids = torch.randint(0, 100, (2, tokens), generator=generator)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if backend is not None:
            backend.synchronize()
        run.losses.append(loss.detach())
        run.grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if offloader is not None:
            run.metrics.append(offloader.end_step())
            run.host_allocations.append(offloader.pool.allocations)
    return run


def assert_identical(expected: Run, got: Run) -> None:
    """Every loss and every gradient of every step bit-identical (torch.equal)."""
    assert len(expected.losses) == len(got.losses)
    for step, (want, have) in enumerate(zip(expected.losses, got.losses, strict=True)):
        assert torch.equal(want, have), f"step {step + 1}: loss {have} != {want}"
    for step, (want, have) in enumerate(zip(expected.grads, got.grads, strict=True)):
        assert want.keys() == have.keys()
        for name in want:
            assert torch.equal(want[name], have[name]), f"step {step + 1}: gradient of {name}"


def offload_blocks(blocks: torch.nn.ModuleList, backend: DeferredCopyBackend, *,
                   prefix: str = "model.layers", **settings: int) -> Offloader:
    """The offload applied to ``blocks`` on the CPU stand-in (every tensor size offloaded)."""
    settings.setdefault("min_tensor_bytes", 0)
    return apply_offload([(f"{prefix}.{i}", b) for i, b in enumerate(blocks)], device=CPU,
                         backend=backend, **settings)


@pytest.fixture
def offload() -> Iterator[Callable[..., Offloader]]:
    """`offload_blocks`, undone after the test (no offloader outlives its test and adds its
    metrics to another's steps)."""
    applied: list[tuple[list[torch.nn.Module], Offloader]] = []

    def apply(blocks: torch.nn.ModuleList, backend: DeferredCopyBackend, **settings: int
              ) -> Offloader:
        offloader = offload_blocks(blocks, backend, **settings)
        applied.append((list(blocks), offloader))
        return offloader

    yield apply
    for modules, offloader in applied:
        remove_offload(modules, offloader)
    gc.collect()


@pytest.fixture
def build_llama() -> Callable[..., torch.nn.Module]:
    """`tiny_llama`."""
    return tiny_llama


@pytest.fixture
def build_stack() -> type[Stack]:
    """`Stack`."""
    return Stack


@pytest.fixture
def train_llama() -> Callable[..., Run]:
    """`llama_steps`."""
    return llama_steps


@pytest.fixture
def identical() -> Callable[[Run, Run], None]:
    """`assert_identical`."""
    return assert_identical
