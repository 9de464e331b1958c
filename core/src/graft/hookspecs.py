"""Hook specifications: the public contract between Graft's core and its plugins.

A plugin is a module (or object) with functions decorated by `graft.hookimpl`, named after the
specs below and exposed through an entry point in the group ``graft.plugins``. Rules that hold
for every hook:

* The core calls hooks with keyword arguments only. An implementation may accept any subset of a
  spec's arguments (new arguments can be added without breaking plugins), in any order.
* Unless a spec says ``firstresult``, every implementation runs and the results come back as a
  list (most recently registered first; ``tryfirst``/``trylast`` reorder).
* ``firstresult`` hooks stop at the first implementation that returns something other than None;
  return None to pass ("this is not mine").
* Hooks run on every rank unless a spec says otherwise, so an implementation must do the same
  thing on every rank (collectives inside a hook must be matched on all ranks).
* Heavy imports (kernels, vLLM) belong inside the hook body, not at the plugin's module level.

The sections follow the order of one run: registration, model build, data, step, loss,
checkpoint, export.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import torch
    from torch.distributed.device_mesh import DeviceMesh

PROJECT_NAME = "graft"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


# --------------------------------------------------------------------------------------------
# Registration: called once per process, right after the plugins are loaded.
# --------------------------------------------------------------------------------------------


@hookspec
def graft_config_sections() -> list[tuple[str, type]]:
    """Declare the config sections this plugin owns.

    When: once per process, when the config schema is composed (before any YAML or override is
    read). Who: any plugin with settings; every rank.

    Return a list of ``(section_name, dataclass)`` pairs. Each section is merged into the schema
    at ``features.<section_name>`` and validated like the core's own sections (struct mode,
    types). Every field needs a default, so the section composes with no user input. Two
    plugins declaring the same section name is an error naming both.

    Must not mutate anything. Not ``firstresult``: every plugin's sections are collected.
    """


@hookspec
def graft_model_families() -> list[Any]:
    """Declare model families (keyed by Hugging Face ``model_type``) this plugin provides.

    When: once per process, when the model registry is first used. Who: model-family plugins;
    every rank.

    Return a list of `graft.models.ModelFamily` objects: the builder, the list of decoder blocks,
    the router adapter, the export handler and the ``parallelize`` function for a model type. A
    family from a plugin replaces the core's built-in family of the same ``model_type``; two
    plugins providing the same ``model_type`` is an error naming both.

    Must not mutate anything. Not ``firstresult``.
    """


# --------------------------------------------------------------------------------------------
# Model build: after the bare model exists, before it is sharded.
# --------------------------------------------------------------------------------------------


@hookspec
def graft_pre_shard(model: torch.nn.Module, cfg: Any, mesh: DeviceMesh | None) -> None:
    """Transform the bare model in place before FSDP2 shards it.

    When: once per model build, after activation-checkpoint wrapping (when enabled) and right
    before ``fully_shard``; on every rank. ``model`` holds real (unsharded) parameters; ``cfg``
    is the composed root config (a dataclass); ``mesh`` is the device mesh the model will be
    sharded over (None in a single-process run without a mesh).

    May mutate ``model`` in place (swap modules for fake-quant versions, wrap decoder blocks for
    activation offload, register router hooks, re-lay experts for expert parallelism). The return
    value is ignored. Not ``firstresult``: every plugin runs, in registration order.
    """


# --------------------------------------------------------------------------------------------
# Data: one packed micro-batch at a time.
# --------------------------------------------------------------------------------------------


@hookspec
def graft_prepare_inputs(batch: dict[str, Any], pad_size: int, layout: Any, cfg: Any) -> None:
    """Adjust a packed micro-batch before the forward pass.

    When: for every micro-batch, after packing, the label roll and ``pad_to_length`` padding,
    before any sequence-parallel split and before the forward; on every rank, for its own
    micro-batch. ``batch`` maps names (``input_ids``, ``labels``, ``loss_mask``,
    ``temperature``, ``position_ids``, RL extras) to per-token tensors of shape ``(R, L)``
    (rows x tokens, plus trailing dims) whose rows end with ``pad_size`` pad tokens added by
    ``pad_to_length`` (0 when padding is off). ``layout`` is the
    `graft.engine.micro_batch.PackedLayout` (where each sample sits; ``layout.pack`` places
    per-sample tensors in the grid).

    May mutate ``batch``: a plugin that carries its own per-token tensor (routing-replay
    targets, for example) adds it here, extended over the pad, so it lines up with the padded
    inputs. The core strips the pad from every per-token output with one shared function
    (``layout.unpad``). Return value ignored. Not ``firstresult``.
    """


# --------------------------------------------------------------------------------------------
# Rollout (RL): generation, and what plugins record during it.
# --------------------------------------------------------------------------------------------


@hookspec
def graft_reward_functions() -> dict[str, Any]:
    """Declare reward functions, selectable with ``algorithm.reward=<name>``.

    When: once per process, when the config is validated and when an RL run starts. Who:
    plugins adding a reward (a verifier, a reward model call); every rank.

    Return ``{name: fn}``; ``fn(response_text, sample)`` gets the decoded response (without
    special tokens) and the `graft.data.tasks.TextSample` it answers (``prompt``, ``response``,
    ``answer``) and returns a float. Two providers of one name is an error. Must not mutate
    anything. Not ``firstresult``.
    """


@hookspec
def graft_rollout_begin(engine: str, model: Any, cfg: Any) -> None:
    """Generation of one RL step is about to start.

    When: every step, before the rollout engine generates; on every rank. ``engine`` is
    ``rollout.engine`` (``embedded`` or ``vllm``); ``model`` is the model that will generate for
    the embedded engine (the trainer's own), None for an external engine; ``cfg`` the root config.

    May mutate ``model`` by registering hooks that record per-token decisions during generation
    (routing replay records each router's top-k here) and must remove them in
    ``graft_rollout_end``. Return value ignored. Not ``firstresult``.
    """


@hookspec
def graft_rollout_end(samples: list[Any], engine: str, cfg: Any) -> None:
    """Generation of one RL step finished; attach what was recorded to the samples.

    When: every step, right after generation, before rewards and the update; on every rank, with
    that rank's samples (`graft.rollout.RolloutSample`: ``prompt_ids``, ``response_ids``,
    ``logprobs``, ``extras``).

    May mutate ``samples``: put per-token tensors in ``sample.extras[name]``, one row per token
    of prompt + response (shape ``(len(prompt_ids) + len(response_ids), ...)``); the core packs
    them into every training micro-batch under ``name`` (pad rows are zeros) where
    ``graft_prepare_inputs`` and the forward can use them. Must remove hooks installed in
    ``graft_rollout_begin``. Not ``firstresult``.
    """


# --------------------------------------------------------------------------------------------
# Step: once per optimizer step.
# --------------------------------------------------------------------------------------------


@hookspec
def graft_step_begin(step: int) -> None:
    """Signal that training step ``step`` (1-based) begins.

    When: at the start of every optimizer step, before rollout or the first micro-batch; on every
    rank. Use it to reset per-step state (offload buffers, replay cursors). Must not mutate
    anything it did not create. Not ``firstresult``.
    """


@hookspec
def graft_step_end(step: int, metrics: dict[str, float]) -> None:
    """Signal that training step ``step`` (1-based) ended, with its metrics.

    When: after the optimizer step and metric reduction, before metrics are logged; on every
    rank (metrics are already reduced across ranks). ``metrics`` maps metric names to floats.

    May mutate ``metrics`` only by adding entries (prefix them with the plugin name, e.g.
    ``offload/host_gb``); must not change or remove the core's entries. Not ``firstresult``.
    """


# --------------------------------------------------------------------------------------------
# Loss: aggregation of the per-token loss matrix into a scalar.
# --------------------------------------------------------------------------------------------


@hookspec
def graft_policy_losses() -> dict[str, Any]:
    """Declare per-token policy losses, selectable with ``loss.policy_loss=<name>``.

    When: once per process, when the config is validated and when the trainer starts. Who:
    plugins adding an RL objective (GSPO...); every rank.

    Return ``{name: function}``; each function is called as
    ``fn(logp=, old_logp=, advantages=, mask=, cfg=)`` with ``(num_sequences, max_len)`` fp32
    tensors (``cfg`` is ``cfg.loss``) and returns ``(loss_mat, metrics)``: the per-token loss of
    the same shape and a dict of per-token metric tensors (averaged over the mask). The result
    is then reduced by ``graft_loss_aggregate`` with ``loss.loss_agg_mode``. Two plugins (or a
    plugin and the core) declaring one name is an error. Must not mutate anything.
    Not ``firstresult``.
    """


@hookspec
def graft_loss_agg_modes() -> list[str]:
    """Declare the ``loss.loss_agg_mode`` names this plugin's ``graft_loss_aggregate`` handles.

    When: once per process, when the config is validated. Who: plugins that implement a mode in
    ``graft_loss_aggregate``; every rank. Return a list of mode names; config validation accepts
    them next to the built-in modes. Must not mutate anything. Not ``firstresult``.
    """


@hookspec(firstresult=True)
def graft_loss_aggregate(
    loss_mat: torch.Tensor, loss_mask: torch.Tensor, mode: str, ctx: Any
) -> torch.Tensor | None:
    """Reduce a micro-batch's per-token loss to the scalar that is back-propagated.

    When: for every micro-batch, after the policy loss is computed; on every rank. ``loss_mat``
    and ``loss_mask`` have shape ``(num_sequences, max_len)``; ``mode`` is
    ``loss.loss_agg_mode``; ``ctx`` is a `graft.losses.AggregationContext` with the global
    (all-reduced over data-parallel ranks and micro-batches) token and sequence counts of the
    mini-batch, the data-parallel size and ``loss_scale_factor``, so that the gradient does not
    depend on how the mini-batch was split.

    ``firstresult``: return the scalar loss for a mode you implement, None otherwise. The core
    implements the five built-in modes; a plugin adds a mode by returning a result for it (and
    declares the name with ``graft_loss_agg_modes`` so config validation accepts it). Must not mutate its
    arguments.
    """


# --------------------------------------------------------------------------------------------
# Checkpoint: between reading a checkpoint and loading it into live objects.
# --------------------------------------------------------------------------------------------


@hookspec
def graft_ckpt_load(
    state: dict[str, Any], model: torch.nn.Module, optimizer: Any, ctx: Any
) -> None:
    """Fix or migrate checkpoint state before it is loaded into the live model and optimizer.

    When: on resume, after the checkpoint was read into ``state`` (``{"model": ..., "optim":
    ...}`` in the flattened layout of ``torch.distributed.checkpoint.state_dict``) and before
    ``set_state_dict``; on every rank, each with its own shard. ``ctx`` is a
    `graft.checkpoint.LoadContext` (checkpoint path, step, saved world size).

    May mutate ``state`` in place (rename keys of an older layout, backfill missing optimizer
    entries: the core's own implementation gives parameters without saved optimizer state the
    state a fresh optimizer would create). Must not touch ``model`` or ``optimizer`` parameters.
    Not ``firstresult``; should not need cross-rank communication.
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
    parallelism), after it was gathered from its shards; on the ranks that export it. ``name``
    is the parameter's fully qualified name in the trained model, ``tensor`` its full value (or
    a contiguous block of experts starting at ``ctx.expert_offset``), ``ctx`` a
    `graft.export.ExportContext` (model type, expert offset, target dtype).

    ``firstresult``: return an iterable of ``(hf_name, tensor)`` pairs for a parameter your model
    family handles (fused experts split per expert, renamed keys), or None to leave it to the
    next handler; the core's default handler passes standard layouts through. Must not mutate
    ``tensor`` (views are fine; the exporter copies them into its bucket).
    """
