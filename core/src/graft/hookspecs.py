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
* Heavy imports (kernels, inference engines) belong inside the hook body, not at the plugin's module level.

Sections follow one run: registration, model build, data, rollout, step, loss, checkpoint, export.
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
# Registration: what a plugin declares (config sections and rules, settings, model families,
# trainer modes, and the named things of each registry). Called when the config is composed
# and when a run starts, never per step; no hook here mutates anything.
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
def graft_auto_settings(cfg: Any, device_type: str) -> dict[str, Any] | None:
    """Pin settings the user left to `auto` to the value this plugin needs.

    When: once per run, at the trainer's start (the device known), before anything is built
    from the config. Who: any plugin; every rank. ``cfg`` is the
    composed config with its `auto` settings unresolved (``rollout.decode: auto``,
    ``engine.max_tokens_per_row: null``...); ``device_type`` is ``cuda`` or ``cpu``.

    Return ``{dotted key: value}`` for settings still at `auto` that this plugin cannot run with
    the device's fast choice (routing replay R3 needs ``rollout.decode=dynamic``: it hooks the
    generating model), or None; keys set explicitly are never changed. Two plugins pinning one
    key to different values is a `ConfigError`. Must not mutate ``cfg``. Not ``firstresult``.
    """


@hookspec
def graft_model_families() -> list[Any]:
    """Declare model families (keyed by Hugging Face ``model_type``) this plugin provides.

    When: once per process, when the model registry is first used. Who: model-family plugins;
    every rank.

    Return a list of `graft.models.ModelFamily` objects: presets, decoder blocks, packing rule and
    packed masks, router modules, weight initialisation, an optional ``parallelize`` function
    (called with keyword arguments, any subset of ``model, family, cfg, mesh, device, role,
    meshes``) and whether it implements expert parallelism (``expert_parallel``). Export layouts are not
    part of a family: they go through ``graft_export_slots``. A family from a plugin replaces
    the core's built-in family of the same ``model_type``; two plugins providing the same
    ``model_type`` is an error naming both.

    Must not mutate anything. Not ``firstresult``.
    """


@hookspec
def graft_trainer_modes() -> dict[str, Any]:
    """Declare training jobs, selectable with ``trainer.mode=<name>``.

    When: once per process, when the config is validated and when a run starts. Who: plugins
    adding a kind of training (DPO, a reward-model trainer...); every rank.

    Return ``{name: factory}``; ``factory(*, cfg, tokenizer, env)`` (any subset of these
    keywords) returns a `graft.TrainingJob` (``attach``, ``step``, ``state_dict``,
    ``load_state_dict``, ``close``). The core provides ``rl`` and ``sft``; two providers of one
    name is an error. Must not mutate anything. Not ``firstresult``.
    """


@hookspec
def graft_parallel_dims(cfg: Any) -> dict[str, int] | None:
    """Size a mesh dimension this plugin drives: ``{"sp": n}`` or None. When: the trainer's start,
    before the meshes; every rank. ``sp`` ranks then share each data-parallel rank's data and
    split its rows (`graft.engine.SequenceShard`); the plugin makes attention span them while
    `graft.engine.active_shard` is set. Must not mutate anything. Not ``firstresult``."""


@hookspec
def graft_config_rules() -> list[Any]:
    """Declare cross-field config rules: functions that check (or fit) the composed config.

    When: once per composed config, after types, choices and ranges are checked (``graft train``
    before any rank starts, ``graft config show/check``, `graft.config.compose`). Who: the core's
    packages and any plugin whose settings depend on others; every rank.

    Return a list of functions. Each is called with the keywords it declares of ``cfg`` (the
    root config, dataclasses), ``manager`` (the plugin manager) and ``user_keys`` (the dotted
    keys the user set, in a file or an override; `graft.config.was_set` reads it). A rule raises
    `graft.errors.ConfigError` naming the keys and the fix. A rule that declares ``user_keys``
    may instead change a default the user did not set to what the rest of the config needs (a
    default never conflicts with a choice): those rules run first, then the others, each group
    in plugin order. Must not mutate anything else. Not ``firstresult``.
    """


@hookspec
def graft_config_choices() -> dict[str, Any]:
    """Declare the registries a config value may name (``graft.config.choice(..., registry=)``).

    When: each time a config is validated, for every `choice` field that names a registry (its
    value is checked against the registry's names). Who: the core's packages (``model_presets``,
    ``policy_losses``, ``loss_agg_modes``, ``rewards``, ``advantage_estimators``,
    ``rollout_corrections``, ``trainer_modes``, ``rollout_engines``, ``environments``) and a
    plugin whose own section has a choice of its own registry; every rank.

    Return ``{registry: names}`` where ``names(*, manager)`` returns the names the registry holds
    with the plugins of ``manager`` (cheap: no torch import); or ``{registry: (names, hint)}``,
    where ``hint(*, manager)`` returns a sentence (starting with a space, or "") appended to the
    error for a value that is none of them. Two plugins declaring one registry is a
    `graft.errors.PluginError`. Must not mutate anything. Not ``firstresult``.
    """


@hookspec
def graft_preflight(cfg: Any) -> None:
    """Check what a run will load from this machine before any rank starts.

    When: once per ``graft train``, in the launching process, after the config is composed and
    validated and before torchrun starts ranks (or the run trains); not on the library path
    (``graft.train(cfg)``), where loading reports the same errors. Who: the core (model
    directory and weights, tokenizer files, dataset files, a writable run directory) and any
    plugin that reads files its settings name. ``cfg`` is the root config.

    Raise a `graft.errors.GraftError` (a `ConfigError` naming the setting and the fix), the one
    loading itself would raise; return None when all is well. Must not mutate ``cfg`` or create
    files that stay. Not ``firstresult``: every implementation runs, most recently registered
    first (the core's checks last).
    """


@hookspec
def graft_reward_functions() -> dict[str, Any]:
    """Declare reward functions, selectable with ``algorithm.reward=<name>``.

    When: once per process, when the config is validated and when an RL run starts. Who:
    plugins adding a reward (a verifier, a reward model call); every rank.

    Return ``{name: fn}`` or ``{name: graft.rl.RewardFunction(fn, data_sources=..., pool=...)}``
    (the ``data_source`` values ``algorithm.reward=auto`` scores with it; threads or worker
    processes). ``fn`` is called with keyword arguments and gets those it declares of
    ``response`` (the decoded response, without special tokens), ``sample`` (the
    sample it answers: ``prompt``, ``answer``, ``data_source``,
    ``extra_info``, ``origin``) and ``cfg`` (the root config); it returns a number. It runs in
    a pool of ``algorithm.reward_workers`` threads or processes, each sample within
    ``algorithm.reward_timeout_s``. A function needing any other argument is refused when the
    plugin registers. Two providers of one name is an error. Must not mutate anything.
    Not ``firstresult``.
    """


@hookspec
def graft_advantage_estimators() -> dict[str, Any]:
    """Declare advantage estimators, selectable with ``algorithm.advantage=<name>``.

    When: once per process, when the config is validated and when an RL run starts. Who:
    plugins adding an estimator; every rank.

    Return ``{name: estimator}``: a `graft.rl.AdvantageEstimator` (its ``compute``
    and the smallest ``rollout.n`` it works with) or a plain function.
    ``compute(*, rewards, group_size, cfg)`` (keyword arguments; any subset) gets this rank's
    rewards ``(N,)`` float64, consecutive groups of ``group_size`` samples of one prompt, and the
    root config, and returns one advantage per sample ``(N,)``. The core provides ``grpo`` and
    ``rloo``; two providers of one name is an error. Must not mutate anything.
    Not ``firstresult``.
    """


@hookspec
def graft_rollout_corrections() -> dict[str, Any]:
    """Declare off-policy corrections, selectable with ``algorithm.rollout_correction=<name>``.

    When: once per process, when the config is validated and when an RL run starts. Who:
    plugins adding a correction of the train-inference mismatch or policy lag; every rank.

    Return ``{name: fn}``; ``fn(*, old_logp, rollout_logp, mask, cfg, root_cfg)`` (any subset)
    gets ``(num_sequences, max_len)`` fp32 tensors (the trainer's old log-probs, the rollout's
    and the loss mask), ``cfg`` = ``cfg.algorithm`` and the root config, and returns the
    per-token weights in that shape; the core multiplies the policy loss by them (detached; a
    non-finite weight becomes 0 and is counted). The core provides ``tis``, ``mis``,
    ``seq_mis`` and ``icepop`` (README.md's RL section); two providers of one name is an error.
    Must not mutate anything. Not ``firstresult``.
    """


@hookspec
def graft_rollout_engines() -> dict[str, Any]:
    """Declare rollout engines, selectable with ``rollout.engine=<name>``.

    When: once per process, when the config is validated and when an RL run starts. Who:
    plugins adding a generator (an inference server client, SGLang...); every rank.

    Return ``{name: factory}``; ``factory(*, cfg, engine, env, run_dir, tokenizer)`` (any subset)
    builds a `graft.rollout.RolloutEngine` from the root config, the trainer's engine (its
    ``model``, ``compute_dtype``, ``family``), the `graft.engine.DistEnv`, the run directory and
    the tokenizer. The core provides ``embedded`` (graft-vllm adds ``vllm``); two
    providers of one name is an error. Must not mutate anything. Not ``firstresult``.
    """


@hookspec
def graft_environments() -> dict[str, Any]:
    """Declare multi-turn tool environments; graft-multiturn consumes this registry (selected
    with ``features.multiturn.environment=<name>``, run by its ``graft_episode_runner``); every
    rank. When: config validation, an RL run's start. Return ``{name: factory}``;
    ``factory(*, cfg, tokenizer)`` builds a ``graft_multiturn.Environment`` per episode. Must not
    mutate anything. Not ``firstresult``."""


@hookspec
def graft_policy_losses() -> dict[str, Any]:
    """Declare per-token policy losses, selectable with ``loss.policy_loss=<name>``.

    When: once per process, when the config is validated and when the trainer starts. Who:
    plugins adding an RL objective (CISPO, GMPO...); every rank.

    Return ``{name: function}``; each function is called with keyword arguments
    ``fn(logp=, old_logp=, advantages=, mask=, cfg=, root_cfg=, tensors=)`` and receives only
    the ones it declares (older losses keep working): ``(num_sequences, max_len)`` fp32 tensors,
    ``cfg`` = ``cfg.loss``, ``root_cfg`` the whole config (a plugin's own section is
    ``root_cfg.features.<name>``), ``tensors`` every per-token tensor of the micro-batch in that
    shape (``rollout_logprobs``, ``old_logprobs``, plugin extras...). It returns
    ``(loss_mat, metrics)``: the per-token loss of the same shape and a dict of per-token
    metric tensors (averaged over the mask). The result is then reduced by
    ``graft_loss_aggregate`` with ``loss.loss_agg_mode``. Two plugins (or a plugin and the core)
    declaring one name is an error. Must not mutate anything. Not ``firstresult``.
    """


@hookspec
def graft_loss_agg_modes() -> list[str]:
    """Declare the ``loss.loss_agg_mode`` names this plugin's ``graft_loss_aggregate`` handles.

    When: once per process, when the config is validated. Who: plugins that implement a mode in
    ``graft_loss_aggregate``; every rank. Return a list of mode names; config validation accepts
    them next to the built-in modes. Must not mutate anything. Not ``firstresult``.
    """


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
# Rollout (RL): generation (or a plugin's episodes in its place), and what plugins record
# during it.
# --------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def graft_episode_runner(cfg: Any, tokenizer: Any, env: Any) -> Any:
    """Take over how an RL step's prompts (and a validation's) become samples.

    When: once per RL run, when the RL job is built (before the rollout engine starts); on
    every rank. Who: a plugin whose samples are more than one ``generate`` per prompt
    (graft-multiturn: episodes in which the model and an environment take turns). ``cfg`` is
    the root config, ``tokenizer`` the run's, ``env`` the `graft.engine.DistEnv`.

    Return a `graft.rollout.EpisodeRunner`: every step the RL job calls its ``run(engine,
    samples, prompts, spec)`` in place of ``engine.generate(prompts, spec)`` (between
    ``graft_rollout_begin`` and ``graft_rollout_end``), then ``check_failures(batch)``; the
    batch's ``samples`` are trained on (a ``loss_mask`` marks the tokens the loss covers), its
    ``total_rewards(score, responses, samples)`` are the rewards and its ``metrics`` join the
    step's. Validation calls ``run`` too (with ``val.*`` sampling). ``run`` runs on every rank,
    also one without prompts, and must keep the engine's collectives paired. Return None to
    pass: one response per prompt from the engine. Must not mutate anything.
    ``firstresult``: the first runner returned is used.
    """


@hookspec
def graft_rollout_begin(engine: str, rollout: Any, model: Any, cfg: Any) -> None:
    """Generation of one RL step is about to start.

    When: every step, before the rollout engine generates; on every rank. ``engine`` is
    ``rollout.engine`` (the engine's kind: ``embedded``, or a plugin's, such as ``vllm``);
    ``rollout`` the engine object (`graft.rollout.RolloutEngine`: ``kind``, ``model``,
    ``llm``, ``request_extras``); ``model`` is the model that will generate for the embedded engine (the
    trainer's own, also ``rollout.model``), None for an external engine; ``cfg`` the root config.

    May mutate ``model`` by registering hooks that record per-token decisions during generation
    (routing replay records each router's top-k here) and must remove them in
    ``graft_rollout_end``; may call ``rollout.request_extras(name)`` for per-request outputs
    the engine can return (graft-vllm's ``routed_experts``), which then arrive in each sample's
    ``engine_extras``. Return value ignored. Not ``firstresult``.
    """


@hookspec
def graft_rollout_end(samples: list[Any], engine: str, rollout: Any, cfg: Any) -> None:
    """Generation of one RL step finished; attach what was recorded to the samples.

    When: every step, right after generation, before rewards and the update; on every rank, with
    that rank's samples (`graft.rollout.RolloutSample`: ``prompt_ids``, ``response_ids``,
    ``logprobs``, ``extras``, ``engine_extras``). ``engine`` and ``rollout`` as in
    ``graft_rollout_begin``.

    May mutate ``samples``: put per-token tensors in ``sample.extras[name]``, one row per token
    of prompt + response (shape ``(len(prompt_ids) + len(response_ids), ...)``); the core packs
    them into every training micro-batch under ``name`` (pad rows are zeros) where
    ``graft_prepare_inputs`` and the forward can use them. Must remove hooks installed in
    ``graft_rollout_begin``. Not ``firstresult``.
    """


@hookspec
def graft_inference_copy(model: torch.nn.Module, trained: torch.nn.Module, cfg: Any) -> None:
    """Make a rollout engine's plain copy of the policy compute what the policy computes.

    When: each time the copy's weights were refreshed from the trained model: once when the copy
    is built, then after every update (``rollout.decode=static``: every rank refreshes its own
    copy); before the copy generates. ``model`` is the copy
    (the trained model's architecture built again
    by transformers, unsharded, in the compute dtype, with the family's ``prepare_model`` but
    none of what ``graft_pre_shard`` installed); the same object comes back at every call. It now
    holds the trained model's weights as the optimizer left them (the masters). ``trained`` is
    the trained policy (sharded; read it, do not run or change it); ``cfg`` the root config
    (None when the copy was built outside a run).

    May mutate ``model``: a plugin whose ``graft_pre_shard`` changes what the policy's forward
    computes (fake quantisation of weights and activations, for example) does the same here, so
    that rollout samples the policy the trainer scores: install forward hooks once (mark the
    model: it comes back) and transform the weights in place after every refresh. Must keep
    every parameter's name, shape and dtype, and must not run collectives (ranks refresh their
    copies independently). Return value ignored. Not ``firstresult``.
    """


@hookspec(firstresult=True)
def graft_static_decoder(model: torch.nn.Module, pad_token_id: int, eos_token_id: int | None,
                         device: torch.device, decode_compile: str, cfg: Any) -> Any:
    """Supply the decode loop the embedded engine's static copy samples with.

    When: once, when the embedded engine builds its static copy (``rollout.decode=static``),
    after the copy's first refresh (``graft_inference_copy`` ran); on every rank, each for its
    own copy. Who: a plugin with a decode loop of its own (graft-graphed-decode: the decode step
    replayed from a CUDA graph). ``model`` is the copy (as in ``graft_inference_copy``);
    ``pad_token_id`` and ``eos_token_id`` the tokenizer's; ``device`` this rank's;
    ``decode_compile`` is ``rollout.decode_compile`` (``cudagraphs``, ``inductor`` or ``none``:
    how transformers' ``generate`` would compile the step); ``cfg`` the root config (None when
    the engine was built outside a run).

    Return an object whose ``generate(ids, mask, spec)`` samples ``spec.max_new_tokens`` tokens
    at most (`graft.rollout.SamplingSpec`: temperature, 0 for greedy; top-p) after the
    left-padded prompts ``ids`` with ``mask`` (both ``(batch, prompt length)``, on ``device``)
    and returns ``(tokens, logprobs)``, both ``(batch, steps)``: a row padded with
    ``pad_token_id`` after its EOS (log-prob 0), the log-probs fp32 under ``logits /
    temperature`` (1 for greedy). Run each step inside the plugins' ``graft_compute`` with
    `graft.engine.compute` (steps ``prefill``, ``decode``, ``sample_logprobs``, phase
    ``rollout``) and take the log-probs with `graft.engine.token_logprobs`, as the core does.
    Return None to pass: transformers' ``generate`` decodes as ``decode_compile`` says.

    May mutate ``model`` (its attention implementation, its blocks' ``forward``), keeping every
    parameter: the copy is refreshed in place after every update and the loop must read it.
    ``firstresult``: the first decoder returned is used.
    """


# --------------------------------------------------------------------------------------------
# Step: once per optimizer step.
# --------------------------------------------------------------------------------------------


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
