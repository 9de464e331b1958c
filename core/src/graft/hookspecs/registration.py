"""Registration hooks: what a plugin declares (config sections and rules, settings, model
families, trainer modes, and the named things of each registry). Called when the config is
composed and when a run starts, never per step; no hook here mutates anything."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from graft.hookspecs import hookspec

if TYPE_CHECKING:
    pass


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
    (the ``data_source`` values ``algorithm.reward=auto`` scores with it; where it wants to
    run: threads or worker processes). ``fn`` is called with keyword arguments and gets those it declares of
    ``response`` (the decoded response, without special tokens), ``sample`` (the
    sample it answers: ``prompt``, ``answer``, ``data_source``,
    ``extra_info``, ``origin``) and ``cfg`` (the root config); it returns a number. It runs in
    the trainer's thread, or where a ``graft_reward_executor`` plugin runs it (graft-reward-pool:
    ``features.reward_pool.workers`` threads or processes, each sample within
    ``features.reward_pool.timeout_s``). A function needing any other argument is refused when the
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
def graft_export_formats() -> dict[str, Any]:
    """Declare checkpoint export formats, selectable with ``graft export --format <name>``.

    When: once per ``graft export`` command, before anything is read. Who: plugins whose
    trained parameters have a format of their own (graft-lora: ``adapter``, a PEFT adapter
    directory); one process (rank 0 of its own one-rank group).

    Return ``{name: writer}``; ``writer(*, model, out_dir, cfg)`` writes ``out_dir`` (a new or
    empty folder, already checked) from ``model``, the run's model rebuilt in this process with
    the checkpoint's weights (``cfg``: the checkpoint's root config). The core's ``hf`` is the
    Hugging Face directory; two providers of one name is an error. Must not mutate anything.
    Not ``firstresult``.
    """


@hookspec
def graft_cli_commands() -> list[Any]:
    """Add subcommands to the ``graft`` command line.

    When: while ``graft`` builds its parser, only for a command line that names no command of
    the core's (``train``, ``plugins``, ``config``, ``ckpt``, ``export``) and for ``graft
    --help``; one process, before any rank exists. Return objects (modules are fine) with
    ``add_parser(subparsers)``, which adds one parser to ``subparsers`` (argparse's) and sets
    its ``run`` default: a function of the parsed ``argparse.Namespace`` returning the exit
    code (graft's errors give exit 2 with their message, as for the core's commands). Must not
    mutate anything and must import nothing heavy: ``graft --help`` calls it. A command named
    like another is a `graft.errors.PluginError`. Not ``firstresult``.
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
