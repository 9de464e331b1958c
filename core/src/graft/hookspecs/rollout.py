"""Rollout hooks (RL): generation, or a plugin's episodes in its place, and what plugins record
during it; who runs the rewards of its samples; the static decode's copy and its decode loop;
the adapters an external engine loads itself; where a step's experience comes from and how it
is shaped before the update."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from graft.hookspecs import hookspec

if TYPE_CHECKING:
    import torch


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


@hookspec(firstresult=True)
def graft_reward_executor(cfg: Any) -> Any:
    """Run the rewards of an RL run's samples somewhere other than the trainer's thread.

    When: once per RL run, when the RL job builds its reward scorer (before the model is built),
    and for every `graft.rl` reward scorer built outside a run (a benchmark); on every rank,
    each for its own samples. Who: a plugin that runs rewards in workers (graft-reward-pool:
    threads or processes, each sample within a time limit) or on a service. ``cfg`` is the
    root config (the rewards get it whole).

    Return a `graft.rl.RewardExecutor`: ``start(rewards)`` once, with the
    `graft.rl.RewardFunction` objects the run's samples use (start workers there: each says
    where it wants to run, ``pool``, and what to import first, ``preload``); ``score(tasks)``
    for each batch of ``(reward, response, sample)`` tasks, returning a
    `graft.rl.RewardBatchResult` (the scores in order, each failed sample a
    `graft.rl.RewardFailure`; `graft.rl.run_reward` calls one reward; a reward's
    `graft.errors.GraftError` is raised as it is); ``metrics()`` after each ``score`` (its
    counts join the step's metrics, next to the core's ``reward_errors``); ``close()`` at the
    run's end. Return None to pass: the core calls each reward in the calling thread, in
    order, without a time limit (`graft.rl.InlineRewards`). Must not mutate ``cfg``.
    ``firstresult``: the first executor returned is used.
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
    holds the trained model's weights as the optimizer left them (the masters; with a required
    ``graft_rollout_adapter``, the frozen base, partly the trained model's own tensors, and the
    adapters installed). ``trained`` is
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
def graft_rollout_adapter(model: torch.nn.Module, cfg: Any) -> Any:
    """Let an inference engine that loads adapters itself take only them at each weight sync.

    When: once per rollout engine that can load adapters (graft-vllm's, through vLLM's LoRA
    loading; the embedded engine's static decode copy), when it is built, before its first
    weights are exported; on every rank that builds it (the training ranks, or a plugin's
    rollout worker). Who: a plugin that trains adapters on a frozen base (graft-lora).
    ``model`` is the policy the engine follows (the trained model, sharded), ``cfg`` the root
    config.

    Return a `graft.rollout.RolloutAdapter` for ``model``: the engine exports its first weights
    inside ``base_only()`` (the frozen base, once), then after every update calls
    ``write(out_dir, is_main=...)`` on every rank and loads the adapter directory (a new
    version each time). The static decode copy, only for a ``required`` adapter, holds the
    frozen base (a parameter whole on the rank already, in the copy's dtype and on its device,
    is the trained model's own tensor: ``graft_inference_copy`` must not change it in place)
    and calls ``install(copy)`` after every refresh. An engine that cannot serve the adapters
    (their ``targets`` on this model and device) raises a `graft.errors.ConfigError` naming
    them and ``fallback``, the setting that syncs merged weights instead, when the adapter is
    ``required``; else it takes merged weights, saying so. Return None to pass: the engine
    takes every weight (``graft_export_entries``' merged ones) at every sync. Must not mutate ``model``.
    ``firstresult``: the first adapter returned is used.
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
    temperature`` (1 for greedy). With ``spec.seeds`` (``rollout.seeded_sampling``), draw
    row i's token at generated position p as the argmax of `graft.rollout.seeded_scores` of
    its logits, seed and p, so its tokens are the core's whatever batch the row is in; a loop
    that cannot raises `graft.errors.PluginError`. Run each step inside the plugins'
    ``graft_compute`` with `graft.engine.compute` (steps ``prefill``, ``decode``,
    ``sample_logprobs``, phase ``rollout``) and take the log-probs with
    `graft.engine.token_logprobs`, as the core does.
    Return None to pass: transformers' ``generate`` decodes as ``decode_compile`` says.

    May mutate ``model`` (its attention implementation, its blocks' ``forward``), keeping every
    parameter: the copy is refreshed in place after every update and the loop must read it.
    ``firstresult``: the first decoder returned is used.
    """


@hookspec(firstresult=True)
def graft_experience_source(cfg: Any, job: Any, engine: Any, env: Any, run_dir: Any) -> Any:
    """Supply the RL steps' scored rollouts from elsewhere than the trainer's own engine.

    When: once per RL run, when the RL job attaches (after a resume, before the first step);
    on every training rank. Who: a plugin that generates on other ranks or machines
    (graft-async-rl: rollout workers that generate ahead with weights up to
    ``features.async_rl.max_staleness`` updates old). ``job`` is the `graft.rl.RLJob`
    (its sampler, prompts and `collect`), ``engine`` the trainer's engine (its ``model``),
    ``env`` the rank's `graft.engine.DistEnv`, ``run_dir`` the run's directory.

    Return a `graft.rl.ExperienceSource`: each step its ``experience(step, prompt_indices)`` is
    what the rank trains on, and after the update ``publish(engine, step)`` hands on the new
    weights; its ``state_dict`` joins the checkpoint. The job then builds no rollout engine.
    Return None to pass: the job generates with ``rollout.engine`` on the training ranks.
    Must not mutate ``cfg``, ``job``'s sampler (the job draws each step's prompts) or
    ``engine``'s weights. ``firstresult``: the first source returned is used.
    """


@hookspec(firstresult=True)
def graft_batch_shaper(cfg: Any, env: Any, eos_token_id: int | None) -> Any:
    """Shape what each RL step trains on: which groups, which samples' loss, which rewards.

    When: once per RL run, when the RL job is built (before the first step; also for a
    plugin's rollout workers' jobs, which never train); on every rank. Who: a plugin that
    filters or reweighs a step's batch (graft-dapo: groups whose ``rollout.n`` rewards are all
    equal dropped and the step refilled with more prompts, truncated responses masked or
    penalised). ``cfg`` is the root config, ``env`` the rank's `graft.engine.DistEnv`,
    ``eos_token_id`` the tokenizer's (a response that ends without it within
    ``rollout.max_new_tokens`` was truncated: `graft.rl.is_truncated`).

    Return a `graft.rl.BatchShaper`: every step the job calls its ``shape(draw, refill=)``
    and trains on the `graft.rl.Experience` it returns (this rank's share; ``rollout.n``
    consecutive samples per prompt). ``draw()`` is this rank's share of one round: the
    sampler's next ``rollout.prompts_per_step`` prompts, generated and scored (or a plugin's
    `graft.rl.ExperienceSource`'s experience for them). ``shape`` calls it at least once and
    the same number of times on every rank (a draw generates: its collectives must pair);
    with ``refill`` False (an experience source supplies the step) exactly once.
    `graft.rl.merge_experiences` joins rounds. The metrics it returns (counts, fractions,
    means) join the step's after the update's and replace any of the same name (so a
    ``response_truncated_fraction`` it reads before zeroing a loss mask is the one logged).
    Return None to pass: the step trains on one ``draw()`` as it is, with no extra metrics.
    Must not mutate ``cfg`` or the drawn samples: return new ones (a ``loss_mask`` of 0 adds
    no gradient and no tokens to the loss normalisers) and new rewards (float64).
    ``firstresult``: the first shaper returned is used.
    """
