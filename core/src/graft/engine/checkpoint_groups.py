"""Activation checkpoints of several decoder blocks (``engine.checkpoint_every_blocks`` > 1).

Per-block checkpointing keeps every block's input for backward: ``layers x hidden`` values per
token (248 KiB per token at Llama-8B shapes in bf16), the largest term at long context once the
logits and the MLP are chunked. A checkpoint of ``k`` consecutive blocks keeps only the first
one's input: ``1/k`` of that. Its backward replays the group's blocks from that input, each
block under a checkpoint of its own (two-level checkpointing), so it holds the ``k`` inputs of
the group's blocks and one block's activations at a time, never ``k`` blocks' activations; each
block runs forward three times instead of two (once without gradients, once in the group's
replay, once in its own backward).

The decoder calls its blocks one by one, so a group cannot be one function call: in training
each block of a group runs without gradients, its call (arguments and all) recorded, and the
group's last block returns its output through an autograd function whose backward replays the
group's calls from the saved input under autograd (with the forward's random state) and
backpropagates through them (``torch.autograd.backward``: the blocks' parameters accumulate
their gradients as in any backward, FSDP2's hooks run around each replayed block). The group's
input is saved inside its first block's call, and each replayed block's input inside that
block's call, so saved-tensor hooks around a block's call (graft-offload's) see exactly the
block's input, as with per-block checkpointing. The other arguments of a block (masks, rotary
embeddings) must need no gradient; a block returns a tensor.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from graft.errors import GraftError

GROUP_ATTRIBUTE = "_graft_checkpoint_group"
_REPLAYING = threading.local()


@dataclass
class _Group:
    """One group's blocks and the calls recorded in the current forward."""

    size: int
    calls: list[tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]] = field(default_factory=list)
    group_input: torch.Tensor | None = None
    saved_input: torch.Tensor | None = None  # `_GroupInput`'s output: its node holds the input
    output: torch.Tensor | None = None
    rng_states: tuple[torch.Tensor, list[torch.Tensor]] | None = None


def _replaying() -> bool:
    return getattr(_REPLAYING, "active", False)


def _no_grad_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple, dict]:
    """``args`` and ``kwargs``, checked: a tensor among them that needs a gradient is an error
    (the replay would lose its gradient)."""
    for value in torch.utils._pytree.tree_leaves((args, kwargs)):
        if isinstance(value, torch.Tensor) and value.requires_grad:
            raise GraftError("engine.checkpoint_every_blocks > 1: a decoder block got an input "
                             "besides its hidden states that needs a gradient; set "
                             "engine.checkpoint_every_blocks=1 for this model")
    return args, kwargs


def _devices_of(tensor: torch.Tensor) -> list[int]:
    return [tensor.device.index or 0] if tensor.is_cuda else []


def _rng_states(tensor: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    cuda = [torch.cuda.get_rng_state(d) for d in _devices_of(tensor)]
    return torch.get_rng_state(), cuda


class _GroupInput(torch.autograd.Function):
    """Saves a group's input while its first block runs; the group's checkpoint reads it from
    this function's node in backward. Its output is an empty tensor that links the two nodes."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, hidden: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(hidden)
        return hidden.new_empty(0)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> None:
        return None  # the group's checkpoint returns the input's gradient


class _GroupCheckpoint(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, group: _Group,
                group_input: torch.Tensor, saved_input: torch.Tensor) -> torch.Tensor:
        ctx.input_node = saved_input.grad_fn  # `_GroupInput`'s node, which saved group_input
        ctx.calls, ctx.rng_states = list(group.calls), group.rng_states
        # the group's output, computed without gradients: not an input of the function, so
        # autograd makes it this function's output, not a view of one
        return group.output

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx,
                 grad_output: torch.Tensor) -> tuple[None, torch.Tensor, None]:
        (group_input,) = ctx.input_node.saved_tensors
        hidden = group_input.detach().requires_grad_()
        cpu_state, cuda_states = ctx.rng_states
        devices = _devices_of(group_input)
        with torch.random.fork_rng(devices=devices), torch.enable_grad():
            torch.set_rng_state(cpu_state)
            for device, state in zip(devices, cuda_states, strict=True):
                torch.cuda.set_rng_state(state, device)
            _REPLAYING.active = True
            try:
                output = hidden
                for block, args, kwargs in ctx.calls:
                    output = block(output, *args, **kwargs)
            finally:
                _REPLAYING.active = False
        torch.autograd.backward(output, grad_output)
        return None, hidden.grad, None


def _grouped_forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """A decoder block's forward as a member of its checkpoint group (module docstring)."""
    group, position = getattr(self, GROUP_ATTRIBUTE)
    forward = type(self).forward
    if _replaying():  # in the group's backward: this block checkpointed on its own
        return torch.utils.checkpoint.checkpoint(forward, self, *args, use_reentrant=False,
                                                 **kwargs)
    if not (self.training and torch.is_grad_enabled()):
        return forward(self, *args, **kwargs)
    if args:
        hidden, rest = args[0], args[1:]
    else:
        kwargs = dict(kwargs)
        hidden, rest = kwargs.pop("hidden_states"), ()
    rest, kwargs = _no_grad_inputs(rest, kwargs)
    if position == 0:
        group.calls, group.group_input = [], hidden
        group.saved_input = _GroupInput.apply(hidden) if hidden.requires_grad else None
        group.rng_states = _rng_states(hidden)
    elif len(group.calls) != position:
        raise GraftError(f"engine.checkpoint_every_blocks: block {position} of a checkpoint "
                         f"group ran without the blocks before it; set "
                         f"engine.checkpoint_every_blocks=1 for this model")
    group.calls.append((self, rest, kwargs))
    with torch.no_grad():
        output = forward(self, hidden, *rest, **kwargs)
    if position < group.size - 1:
        return output
    if not isinstance(output, torch.Tensor):
        raise GraftError(f"engine.checkpoint_every_blocks > 1 needs decoder blocks that return "
                         f"a tensor; {type(self).__name__} returned {type(output).__name__}")
    group_input, saved_input = group.group_input, group.saved_input
    group.group_input = group.saved_input = None
    if saved_input is None:  # the input needs no gradient: nothing to backpropagate to
        group.calls = []
        return output
    group.output = output
    try:
        return _GroupCheckpoint.apply(group, group_input, saved_input)
    finally:
        group.calls, group.output = [], None


def apply_checkpoint_groups(blocks: Sequence[torch.nn.Module], every_blocks: int) -> int:
    """Checkpoint ``blocks`` (in forward order) ``every_blocks`` at a time (the last group may
    be shorter), in place: each block's instance gets a ``forward`` that joins its group.
    Returns the number of groups."""
    if every_blocks < 1:
        raise ValueError(f"every_blocks must be >= 1, got {every_blocks}")
    groups = 0
    for start in range(0, len(blocks), every_blocks):
        members = blocks[start:start + every_blocks]
        group = _Group(size=len(members))
        for position, block in enumerate(members):
            setattr(block, GROUP_ATTRIBUTE, (group, position))
            block.forward = types.MethodType(_grouped_forward, block)
        groups += 1
    return groups


def checkpoint_groups_applied(blocks: Sequence[torch.nn.Module]) -> bool:
    """True when ``blocks`` were grouped by `apply_checkpoint_groups`."""
    return all(hasattr(b, GROUP_ATTRIBUTE) for b in blocks)
