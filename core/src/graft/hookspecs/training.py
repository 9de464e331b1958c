"""Training hooks, in the order of a step: the model before it is sharded, each packed
micro-batch, the wrapper around every step of the computation, the loss's aggregation and
the optimizer step."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from graft.hookspecs import hookspec

if TYPE_CHECKING:
    import torch
    from torch.distributed.device_mesh import DeviceMesh


# --------------------------------------------------------------------------------------------
# Model build: after the bare model exists, before it is sharded.
# --------------------------------------------------------------------------------------------


@hookspec
def graft_pre_shard(model: torch.nn.Module, cfg: Any, mesh: DeviceMesh | None, role: str,
                    meshes: Any) -> None:
    """Transform the bare model in place before FSDP2 shards it.

    When: once per model build, after activation-checkpoint wrapping (when enabled) and right
    before expert parallelism and ``fully_shard``; on every rank. ``model`` holds real
    (unsharded) parameters; ``cfg`` is the composed root config (a dataclass); ``mesh`` the mesh
    it will be sharded over (all ranks; None in a process without one), ``meshes`` every
    dimension's (`graft.engine.ParallelMeshes`: ``"shard"``, ``"dp"``, ``"sp"``, ``"ep"``,
    ``"efsdp"``; None without a mesh). ``role``: ``policy`` (the trained model) or ``reference``
    (the frozen KL reference, no gradients: leave it alone unless your change must apply to it
    too, as a numerics change such as quantisation does).

    May mutate ``model`` in place (swap modules for fake-quant versions, wrap decoder blocks for
    activation offload, register router hooks). The return value is ignored.
    Not ``firstresult``: every plugin runs, in registration order.
    """


# --------------------------------------------------------------------------------------------
# Data: one packed micro-batch at a time.
# --------------------------------------------------------------------------------------------


@hookspec
def graft_prepare_inputs(batch: dict[str, Any], pad_size: int, layout: Any, cfg: Any,
                         phase: str, shard: Any) -> None:
    """Adjust a packed micro-batch before the forward pass.

    When: before every packed forward of the trainer (every micro-batch of every pass), after
    packing, the label roll and ``pad_to_length`` padding, before any sequence-parallel split;
    on every rank, for its own micro-batch. ``phase`` says which pass this is (see
    `graft.engine.Phase`): ``sft`` or ``update`` (forward + backward), ``old_logprobs`` (the
    policy's log-probs before the update), ``ref_logprobs`` (the frozen reference),
    ``rollout_logprobs`` (the trainer scores samples whose engine gave no log-probs).
    ``batch`` maps names (``input_ids``, ``labels``, ``loss_mask``, ``temperature``,
    ``position_ids``, RL extras, tensors kept by ``graft_post_forward``) to per-token ``(R, L,
    ...)`` tensors whose rows end with ``pad_size`` pad tokens (``pad_to_length``, the multiple
    of ``sp``; 0 without padding). ``layout`` is the
    micro-batch's packed layout (where each sample sits; ``layout.pack`` places
    per-sample tensors in the grid). ``shard`` (`graft.engine.SequenceShard`): the columns of
    every row this rank's forward computes (all without sequence parallelism; with it every
    tensor is cut to ``shard.local(tensor)`` after this hook); state armed for the forward
    itself (routing-replay targets) takes ``shard.local`` of it.

    May mutate ``batch``: a plugin's own per-token tensor (routing-replay targets) is added
    here, extended over the pad; the core strips the pad from every per-token output with one
    function (``layout.unpad``). Return value ignored. Not ``firstresult``.
    """


@hookspec
def graft_post_forward(batch: dict[str, Any], layout: Any, phase: str,
                       cfg: Any, shard: Any) -> dict[str, Any] | None:
    """Collect what a plugin recorded during one micro-batch's forward.

    When: after every packed forward of the trainer (same passes and ``phase`` values as
    ``graft_prepare_inputs``), before the loss and backward; on every rank, for its own
    micro-batch. ``batch`` holds the tensors the forward saw (``shard.local`` of each);
    ``layout`` its packed layout (``layout.unpad`` gives one tensor
    per sample, without the pad); ``shard`` the `graft.engine.SequenceShard` it computed.

    Return ``{name: tensor}`` of per-token ``(R, shard.length, ...)`` tensors (the core gathers
    the ``sp`` ranks' parts into whole ``(R, L, ...)`` rows) to keep with this micro-batch,
    or None: later passes over it (the updates after an RL step's old-log-prob pass) find them
    in ``batch``. Must not mutate ``batch``. Two plugins returning one name is an error.
    Not ``firstresult``.
    """


# --------------------------------------------------------------------------------------------
# Compute: around each step of the model's computation (the trainer's and the embedded rollout's).
# --------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def graft_compute(step: str, phase: str, model: torch.nn.Module, cfg: Any) -> Any:
    """Run one step of the model's computation inside a context of this plugin's.

    When: around every packed forward and backward of the trainer and every step of the
    embedded rollout engine's generation; on every rank that runs the step. ``step`` names it:
    ``forward`` (a micro-batch to its log-probs), ``gradient``
    (the loss's gradient the fused head takes inside that forward), ``backward``,
    ``generate`` (transformers' ``generate``), ``prefill`` and ``decode`` (the decode loop's
    prompt pass and one of its steps; on CUDA a decode step runs once to be recorded in a
    CUDA graph, whose replays call no hook) and ``sample_logprobs`` (the sampled tokens'
    log-probs from a step's logits). ``phase`` is the trainer's pass (`graft.engine.Phase`:
    ``update``, ``old_logprobs``...) or ``rollout``; ``model`` the model computing (the policy,
    the frozen reference or the rollout's inference copy); ``cfg`` the root config (None for
    a decoder built outside a run).

    Implement it as a wrapper only, ``@graft.hookimpl(wrapper=True)``: a generator that enters
    its context, lets the step run at its ``yield`` and returns what the ``yield`` gave (``with
    my_kernels(): return (yield)``); the step's exception is raised at the ``yield``. A plain
    implementation is refused when the plugin registers: the core runs the step. Wrappers nest,
    the last registered outermost. Must not mutate ``model`` or ``cfg``. ``firstresult``: the
    result is the step's own (a wrapper may replace it).
    """


# --------------------------------------------------------------------------------------------
# Loss: aggregation of the per-token loss matrix into a scalar.
# --------------------------------------------------------------------------------------------


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
# Step: once per optimizer step.
# --------------------------------------------------------------------------------------------


@hookspec
def graft_train_begin(cfg: Any, run_dir: Any, is_main: bool, start_step: int,
                      metrics: dict[str, float]) -> None:
    """Signal that training begins (a logger opens its run here: graft-wandb, graft-tensorboard).

    When: once per run, right before step ``start_step + 1`` (after the model is built, the
    checkpoint resumed and the record of step 0 logged); on every training rank, not on ranks
    of other roles, and not when a finished run is started again. ``cfg`` is the root config
    with its ``auto`` settings chosen, ``run_dir`` the run directory (a `pathlib.Path`),
    ``is_main`` the rank that writes files; ``start_step`` the step training continues after:
    0 for a new run (or one that starts over), else the resumed checkpoint's step (the steps
    after it may have reached ``graft_step_end`` before, in the attempt that stopped);
    ``metrics`` step 0's record, what ran before the first step (``val/*`` of the first
    validation; empty when nothing ran, and on a resume).

    Write only under ``run_dir``, to paths your plugin owns; must not mutate ``cfg`` or
    ``metrics``. Not ``firstresult``.
    """


@hookspec
def graft_step_begin(step: int) -> None:
    """Signal that training step ``step`` (1-based) begins.

    When: at the start of every step, before rollout or the first micro-batch; on every rank.
    Resets per-step state (offload buffers, replay cursors); mutate nothing else. Not ``firstresult``.
    """


@hookspec
def graft_step_end(step: int, metrics: dict[str, float]) -> None:
    """Signal that training step ``step`` (1-based) ended, with its metrics.

    When: after the optimizer step and metric reduction, before metrics are logged; on every
    rank (metrics are already reduced across ranks). ``metrics`` maps metric names to floats.

    May mutate ``metrics`` only by adding entries (prefix them with the plugin name, e.g.
    ``offload/host_gb``); must not change or remove the core's entries. Not ``firstresult``.
    """


@hookspec
def graft_train_end(model: torch.nn.Module, cfg: Any, run_dir: Any, is_main: bool) -> None:
    """Write what a plugin leaves at the end of a training run, next to the core's ``hf/``.

    When: once, after the last step and its checkpoint are saved and before the Hugging Face
    export (``export.hf_at_end``); on every training rank (it may run collectives over the
    model's ranks), not on ranks of other roles, and not when a finished run is started
    again. ``model`` is the trained (possibly sharded) policy, ``cfg`` the root config,
    ``run_dir`` the run directory (a `pathlib.Path`); ``is_main`` is the rank that writes
    files. Write only under ``run_dir``, to paths your plugin owns; must not mutate ``model``
    or ``cfg``. Not ``firstresult``.
    """


# --------------------------------------------------------------------------------------------
# Roles: ranks of the run that do something other than train.
# --------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def graft_rank_roles(cfg: Any, world_size: int) -> dict[str, list[int]] | None:
    """Split the run's ranks into roles.

    When: once per run, before the process group's meshes are built; on every rank (each must
    get the same answer). Who: a plugin whose ranks do other work than training (graft-async-rl:
    rollout workers). ``cfg`` is the composed root config; ``world_size`` the number of ranks
    torchrun started (1 without torchrun).

    Return global ranks by role name: ``trainer`` (rank 0, which writes the run's files, and
    others) and the plugin's own roles; every rank exactly once. Each role gets meshes of its
    own (`graft.engine.DistEnv` ``role``, ``role_ranks``, ``group``; the trainers' with
    ``engine.ep_size`` and the sequence-parallel size), the trainers build and train the
    model, and a rank of another role runs what ``graft_role_runner`` returns for it. Return
    None to pass: every rank trains. Must not mutate ``cfg``. ``firstresult``: the first split
    returned is used.
    """


@hookspec(firstresult=True)
def graft_role_runner(role: str, cfg: Any, env: Any, run_dir: Any) -> Any:
    """Run a rank whose role is not ``trainer``.

    When: once per run on each rank of such a role, after the process group, the run
    directory and the resolved config exist, in place of building the model and training.
    Who: the plugin that gave the role (``graft_rank_roles``). ``cfg`` is the root config with
    its ``auto`` settings chosen, ``env`` the rank's `graft.engine.DistEnv`, ``run_dir`` the
    run's directory (a `pathlib.Path`; rank 0 of the trainers writes it).

    Return a callable taking no arguments: the trainer calls it where a training rank trains
    (`graft.Trainer.fit`); it returns when the run ends and raises what should
    stop the run. Return None to pass. Must not mutate ``cfg`` or ``env``.
    ``firstresult``: the first runner returned is used.
    """
