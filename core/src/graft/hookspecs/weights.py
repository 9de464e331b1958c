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


@hookspec
def graft_ckpt_save(state: dict[str, Any], model: torch.nn.Module, optimizer: Any) -> None:
    """Choose what a checkpoint holds, before it is written.

    When: at every checkpoint save, on every rank, after the live entries were collected and
    before the disk space is checked and anything is written. ``state`` is ``{"model": ...,
    "optim": ...}`` keyed as in ``graft_ckpt_load``.

    May mutate ``state`` by deleting entries that your plugin rebuilds identically on resume
    without reading them (a frozen base model that ``model.path`` or the seed recreates, under
    adapters); the same
    entries must then be kept fresh on load (``graft_ckpt_load``: add ``"model.<fqn>"`` to
    ``ctx.keep_fresh``), or the load fails naming them. Delete the same keys on every rank. Must
    not touch ``model`` or ``optimizer``. Not ``firstresult``; no cross-rank communication.
    """


# --------------------------------------------------------------------------------------------
# Model weights: after reading a ``model.path`` checkpoint into a built model.
# --------------------------------------------------------------------------------------------


@hookspec
def graft_weights_loaded(model: torch.nn.Module, missing: list[str], seed: int) -> list[str]:
    """Initialise the parameters a ``model.path`` checkpoint has no values for.

    When: once per model built from ``model.path``, on every rank, right after its weights were
    read into the sharded model. ``missing`` are
    the fully qualified names of the model's parameters and buffers the checkpoint lacks: a
    plugin's own additions (adapters made in ``graft_pre_shard``, on meta until now: their
    storage is uninitialised). ``seed`` is ``trainer.seed``, for initialising them as the
    same run built from a preset would.

    Fill the ones your plugin created (sharded values: the same full tensor on every rank,
    then each rank's shard) and return their names; mutate nothing else of ``model``. A missing
    name that no plugin returns is an error naming it. Not ``firstresult``: every plugin runs;
    the names are collected.
    """


# --------------------------------------------------------------------------------------------
# Export: mapping trained parameters to the consumer's (Hugging Face) layout.
# --------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def graft_export_entries(
    model: torch.nn.Module, entries: list[tuple[str, Any]]
) -> list[tuple[str, Any]] | None:
    """The tensors an export of ``model`` covers, when they are not its own state dict.

    When: at every export of the trained model (a Hugging Face directory, an inference
    engine's weight sync, the embedded engine's decode copy), on every rank, before anything
    is gathered, and when an export's bucket plan is made. ``entries`` are the core's
    ``(name, tensor)`` pairs in export order: parameters and persistent buffers, tied ones once.

    ``firstresult``: return the list to export instead, or None to keep ``entries``. An entry's
    value is a tensor, or a function of no arguments that returns one, called on every rank in
    export order when its turn comes (it may run collectives: every rank calls it), so a value
    computed from several parameters (base weight + adapter product) exists one at a time.
    A computed value has the shape, dtype and sharding (a DTensor placed as its parameter) of
    the parameter it stands for. Such an export streams parameter by parameter (no bucket
    plan). Must not mutate ``model``.
    """




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
