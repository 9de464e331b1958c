"""Weight hooks: between reading a checkpoint and loading it into live objects, and mapping
trained parameters to the consumer's (Hugging Face, an inference engine's) layout."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from graft.hookspecs import hookspec

if TYPE_CHECKING:
    import torch


# --------------------------------------------------------------------------------------------
# Checkpoint: between reading a checkpoint and loading it into live objects.
# --------------------------------------------------------------------------------------------


@hookspec
def graft_ckpt_load(
    state: dict[str, Any], model: torch.nn.Module, optimizer: Any, ctx: Any
) -> None:
    """Map a checkpoint onto the live model and optimizer before anything is read or checked.

    When: on resume, after the checkpoint's metadata was read and before the compatibility
    check and the read of its tensors; on every rank, each with its own shard. ``state`` is
    ``{"model": ..., "optim": ...}``: the live model's and optimizer's entries, keyed by their
    names in the flattened layout of ``torch.distributed.checkpoint.state_dict``, holding the
    tensors the checkpoint will be read into. ``ctx`` is a `graft.checkpoint.LoadContext`
    (checkpoint path, step, saved world size, ``checkpoint_keys``, ``keep_fresh``).

    May mutate ``state`` in place: move an entry's tensor under the key an older layout used
    (read from there, loaded back under its live name), or add entry keys
    (``"optim.state.<fqn>.exp_avg"``) to ``ctx.keep_fresh`` to keep their fresh value (the core
    does so for parameters a checkpoint has no optimizer state for). Every remaining entry must
    then exist in the checkpoint with its shape, or the load fails naming it. Must not touch
    ``model`` or ``optimizer`` parameters. Not ``firstresult``; no cross-rank communication.
    """


# --------------------------------------------------------------------------------------------
# Export: mapping trained parameters to the consumer's (Hugging Face) layout.
# --------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def graft_export_slots(
    name: str, tensor: torch.Tensor, ctx: Any
) -> Iterable[tuple[str, torch.Tensor]] | Iterator[tuple[str, torch.Tensor]] | None:
    """Map one trained parameter (or a block of it) to Hugging Face checkpoint names and tensors.

    When: during weight export, once per parameter (or per expert block under expert
    parallelism), after it was gathered from its shards; on the exporting rank (rank 0), and
    on meta tensors whenever the exporter probes a layout (``enumerate_hf_slots``). ``name`` is
    the parameter's fully qualified name in the trained model, ``tensor`` its full value, or for
    an expert-parallel parameter one ``ep`` rank's block of experts starting at global expert
    ``ctx.expert_offset``: a handler that returns the block itself (a fused HF layout, renamed
    or not) has it streamed as row blocks of the HF tensor, which the sink assembles; one that
    returns other tensors (per-expert names with global ids) has those streamed as they are.
    ``ctx`` is a `graft.export.ExportContext` (model type, expert offset, target dtype, and
    ``consumer``: ``hf`` or ``inference``, whose layout to produce).

    ``firstresult``: return an iterable of ``(hf_name, tensor)`` pairs for a parameter your model
    family handles (fused experts split per expert with global ids, renamed keys), or None to
    leave it to the next handler; the core's default handler applies transformers' own
    conversion mapping (per-expert ids shifted by ``ctx.expert_offset``). Must not mutate
    ``tensor`` (views are fine). Fastest: return ``tensor`` or contiguous views tiling it
    (``tensor[i]`` per expert): the whole parameter is then copied once and the handler is never
    called on real data, so slice real data exactly as a meta tensor of the same shape.
    """
