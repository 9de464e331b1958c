"""The RL step: generate, score, compute advantages, recompute log-probs, update, push weights.

Each rank takes its share of the step's prompts, generates ``rollout.n`` samples per prompt, and
trains on them with the configured policy loss and ``loss.loss_agg_mode`` (normalisers global
over each mini-batch). The old log-probs are recomputed when the step updates more than once
(``algorithm.ppo_epochs`` x ``algorithm.mini_batches`` > 1; with a single update they equal the
update's own: the ratio is 1 by construction) and with an off-policy correction
(``algorithm.rollout_correction``, `graft.rl.corrections`), which weights each token's policy
loss by the ratio of the old log-probs to the rollout's. After the update the rollout engine
receives the new weights. A plugin may supply each step's scored samples instead
(``graft_experience_source``, `graft.rl.experience`: graft-async-rl's rollout workers), which
then receive the weights; `RLJob.collect` is what such workers run. A plugin may shape what each
step trains on (``graft_batch_shaper``, `graft.rl.BatchShaper`: graft-dapo's dynamic sampling
and overlong filter); without one the step trains on one draw. With a held-out set the job
validates (`graft.rl.validation`) and it writes a few of each step's generations to
``samples.jsonl`` (`graft.training.samples`), in `after_step`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from graft.data.dataset import load_prompts, load_validation_prompts
from graft.data.sampler import EpochSampler
from graft.engine.batch.micro_batch import MicroBatch, TokenSample
from graft.engine.distributed.env import DistEnv, share_within_sp
from graft.engine.distributed.parallelize import build_parallel_model
from graft.engine.phase import OLD_LOGPROBS, REF_LOGPROBS, ROLLOUT_LOGPROBS
from graft.engine.train_engine import LossFn, TrainEngine
from graft.errors import ConfigError
from graft.losses.aggregation import loss_scale_factor
from graft.losses.contract import is_token_separable, token_separable
from graft.losses.policy import kl_penalty
from graft.losses.registry import policy_losses
from graft.plugins import get_plugin_manager
from graft.plugins.keywords import call_with_keywords
from graft.rl.advantages import advantage_estimators, compute_advantages
from graft.rl.corrections import WEIGHTS, apply_correction, rollout_corrections
from graft.rl.experience import BatchShaper, Experience, ExperienceSource, sample_seed
from graft.rl.rewards import RewardScorer
from graft.rl.step_metrics import EXACT_FRACTION, MISMATCH, mismatch_metrics, rollout_metrics
from graft.rl.validation import Validator
from graft.rollout.types import EpisodeBatch, EpisodeRunner, RolloutEngine, RolloutSample, SamplingSpec
from graft.training.job import validation_due
from graft.training.metrics import console_print
from graft.training.samples import SampleLog, format_sample, sample_records, shown_to_model

if TYPE_CHECKING:
    from graft.config.schema import GraftConfig


def rl_loss(*, cfg: GraftConfig, on_policy: bool = False) -> LossFn:
    """The configured policy loss plus the KL penalty (``loss.kl_coef``) per token.

    ``cfg`` is the root config: the loss reads ``cfg.loss``, the policy loss gets that section
    as ``cfg`` and the whole as ``root_cfg``.

    ``on_policy``: no old log-probs were recomputed; they are the update's own (detached), and
    the train-inference mismatch is measured here instead. With ``algorithm.rollout_correction``
    the policy loss is multiplied by the step's weights (`graft.rl.corrections`).
    """
    loss_cfg = cfg.loss
    policy = policy_losses()[loss_cfg.policy_loss]
    corrected = cfg.algorithm.rollout_correction != "none"

    def loss_fn(logp: torch.Tensor, tensors: Mapping[str, torch.Tensor],
                mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        old = logp.detach() if on_policy else tensors["old_logprobs"]
        loss, metrics = call_with_keywords(policy, logp=logp, old_logp=old,
                                           advantages=tensors["advantages"], mask=mask,
                                           cfg=loss_cfg, root_cfg=cfg, tensors=tensors)
        if corrected:
            loss = loss * tensors[WEIGHTS]
        if on_policy:
            rollout = tensors["rollout_logprobs"]
            metrics = {**metrics, MISMATCH: (old - rollout).abs(),
                       EXACT_FRACTION: (old == rollout).float()}
        if loss_cfg.kl_coef > 0:
            kl = kl_penalty(logp, tensors["ref_logprobs"], loss_cfg.kl_type)
            loss = loss + loss_cfg.kl_coef * kl
            metrics = {**metrics, "kl": kl.detach()}
        return loss, metrics

    # PPO and the KL penalty are per token: the loss is token-separable when the policy is
    return token_separable(loss_fn) if is_token_separable(policy) else loss_fn


def label_aligned(sample: RolloutSample, values: torch.Tensor) -> torch.Tensor:
    """Per-response-token values placed where the trainer predicts those tokens (position t
    predicts token t + 1), zeros elsewhere; length ``len(prompt) + len(response)``."""
    out = torch.zeros(len(sample.prompt_ids) + len(sample.response_ids))
    start = len(sample.prompt_ids) - 1
    out[start:start + len(values)] = values.float()
    return out


class RLJob:
    """Prompts, reward, rollout engine and the update of one RL run, from the root config
    ``cfg`` (which the rollout engine, the rewards and the plugins' hooks get whole)."""

    def __init__(self, cfg: GraftConfig, tokenizer: Any, env: DistEnv) -> None:
        self.cfg = cfg
        self.env = env
        self.tokenizer = tokenizer
        prompts = load_prompts(cfg.data, tokenizer, seed=cfg.trainer.seed)
        self.texts, self.prompts = prompts.samples, prompts.ids
        self.sampler = EpochSampler(len(self.texts), seed=cfg.trainer.seed, shuffle=cfg.data.shuffle)
        self.validator = _validator(tokenizer, env, cfg=cfg)
        held_out = self.validator.samples if self.validator is not None else []
        self.rewards = RewardScorer([*self.texts, *held_out], cfg=cfg)  # starts the reward workers
        self.sample_log = SampleLog(Path("."), enabled=False)  # the run's own from `attach`
        self._records: list[dict[str, Any]] = []  # this step's, for samples.jsonl
        self.estimator = advantage_estimators()[cfg.algorithm.advantage]
        correction = cfg.algorithm.rollout_correction
        self.correction = None if correction == "none" else rollout_corrections()[correction]
        self.spec = SamplingSpec(cfg.rollout.temperature, cfg.rollout.top_p,
                                 cfg.rollout.max_new_tokens)
        self.rollout: RolloutEngine | None = None
        self.reference: TrainEngine | None = None
        self.source: ExperienceSource | None = None  # a plugin's, in place of `collect`
        self.engine: TrainEngine | None = None  # a rollout worker's own copy (`for_rollouts`)
        self.steps_done = 0
        self._source_state: dict[str, Any] | None = None  # a checkpoint's, until `attach`
        # a plugin's runner in place of one generate per prompt (graft-multiturn's episodes)
        self.episodes: EpisodeRunner | None = get_plugin_manager().hook.graft_episode_runner(
            cfg=cfg, tokenizer=tokenizer, env=env)
        # a plugin's shaping of each step's batch (graft-dapo); None: one draw, as it is
        self.shaper: BatchShaper | None = get_plugin_manager().hook.graft_batch_shaper(
            cfg=cfg, env=env, eos_token_id=tokenizer.eos_token_id)

    @classmethod
    def for_rollouts(cls, cfg: GraftConfig, *, env: DistEnv, run_dir: Path) -> RLJob:
        """A job that only collects, for a rank of a plugin's role (``graft_role_runner``: a
        rollout worker). It builds its own copy of the policy on ``env``'s ranks (``cfg.model``
        from the seed or ``model.path``; no optimizer) in ``job.engine`` and the engine
        ``rollout.engine`` names on it in ``job.rollout``. `collect` generates and scores; whoever
        changes ``job.engine.model``'s weights then calls ``job.rollout.sync_weights()``."""
        from graft.data.tokenizer import load_tokenizer
        from graft.engine.distributed.parallelize import mixed_precision_policy
        from graft.rollout.builtin import build_rollout

        tokenizer = load_tokenizer(cfg.data.tokenizer, cfg.model.path)
        job = cls(cfg, tokenizer, env)
        model, family = build_parallel_model(env, cfg=cfg)
        policy = mixed_precision_policy(cfg.engine.mixed_precision, env.device)
        dtype = policy.param_dtype or next(model.parameters()).dtype
        job.engine = TrainEngine(model, family, None, None, env, cfg, dtype,
                                 tokenizer.pad_token_id)
        job.rollout = build_rollout(cfg=cfg, engine=job.engine, env=env, run_dir=run_dir,
                                    tokenizer=tokenizer)
        return job

    def attach(self, engine: TrainEngine, run_dir: Path) -> None:
        """Start the rollout engine, or a plugin's `ExperienceSource` in its place
        (``graft_experience_source``), and the frozen reference for the KL penalty."""
        from graft.rollout.builtin import build_rollout

        self.source = get_plugin_manager().hook.graft_experience_source(
            cfg=self.cfg, job=self, engine=engine, env=self.env, run_dir=run_dir)
        if self.source is not None and self.validator is not None:
            raise ConfigError("validation (data.val_path with trainer.val_every_steps) runs on the "
                              "trainers' own rollout engine, which a plugin's experience source "
                              "replaces (graft_experience_source); set trainer.val_every_steps=0")
        if self.source is None:
            self.rollout = build_rollout(cfg=self.cfg, engine=engine, env=self.env,
                                         run_dir=run_dir, tokenizer=self.tokenizer)
        elif self._source_state is not None:
            self.source.load_state_dict(self._source_state)
        self.sample_log = SampleLog(run_dir, enabled=self.env.is_main
                                    and self.cfg.trainer.log_samples > 0)
        if self.cfg.loss.kl_coef > 0:
            self.reference = build_reference(self.env, engine, cfg=self.cfg)

    def step(self, engine: TrainEngine) -> dict[str, float]:
        """One RL step on this rank's share of ``rollout.prompts_per_step`` prompts: their
        scored rollouts (`collect`, or the plugin's `ExperienceSource`), the update, and the
        new weights handed to whatever generates next."""
        self.steps_done += 1

        def draw() -> Experience:  # one round: a fresh draw of the step's prompt count
            indices = self.sampler.next_batch(self.cfg.rollout.prompts_per_step)
            if self.source is None:
                return self.collect(indices[self.env.dp_rank::self.env.dp_size],
                                    step=self.steps_done)
            return self.source.experience(self.steps_done, indices)

        # a plugin's shaping (``graft_batch_shaper``: graft-dapo's dynamic sampling, overlong
        # filter or penalty) may draw again, except from a plugin's source; none: one draw
        shaped: dict[str, float] = {}
        if self.shaper is None:
            experience = draw()
        else:
            experience, shaped = self.shaper.shape(draw, refill=self.source is None)
        metrics = self.train_on(engine, experience)
        # after the update's: a shaper's response_truncated_fraction was read before the masks
        # it set (a masked turn no longer counts as truncated)
        metrics.update(shaped)
        metrics.update(self.rollout.sync_weights() if self.source is None
                       else self.source.publish(engine, self.steps_done))
        return metrics

    def collect(self, prompt_indices: Sequence[int], *, step: int) -> Experience:
        """Generate ``rollout.n`` samples for each of the prompts ``prompt_indices`` (positions
        in the dataset) with this job's rollout engine, and score them. ``step`` is the RL
        step they are for (1-based; it keys the sampling under ``rollout.seeded_sampling``).
        Used by `step` in the colocated mode, and by a plugin's rollout workers."""
        hook = get_plugin_manager().hook
        n = self.cfg.rollout.n
        prompts = [self.prompts[i] for i in prompt_indices for _ in range(n)]
        texts = [self.texts[i] for i in prompt_indices for _ in range(n)]
        kind = self.rollout.kind
        hook.graft_rollout_begin(engine=kind, rollout=self.rollout, cfg=self.cfg,
                                 model=self.rollout.model)
        started = time.perf_counter()
        episodes = None
        if self.episodes is not None:
            episodes = self.episodes.run(self.rollout, texts, prompts, self.spec)
            self.episodes.check_failures(episodes)  # a warning; a PluginError after a streak
            samples = episodes.samples
        else:
            spec = self._spec_for(prompt_indices, step=step)
            samples = self.rollout.generate(prompts, spec) if prompts else []
        rollout_s = time.perf_counter() - started
        hook.graft_rollout_end(samples=samples, engine=kind, rollout=self.rollout, cfg=self.cfg)
        # Sequence parallelism: the sp ranks of one data-parallel rank generated for the same
        # prompts; they train on one set of samples (their first rank's), split by sequence.
        samples = share_within_sp(samples, self.env)
        responses = [self._decode(s) for s in samples]
        rewards = torch.tensor(self._score(responses, texts, episodes), dtype=torch.float64)
        metrics = {**self.rewards.metrics(), **(episodes.metrics if episodes is not None else {})}
        return Experience(list(prompt_indices), texts, samples, rewards, rollout_s, metrics)

    def _spec_for(self, prompt_indices: Sequence[int], *, step: int) -> SamplingSpec:
        """The step's sampling: under ``rollout.seeded_sampling`` each sample's own seed
        (`sample_seed` of the run's seed, ``step``, its prompt's index and its number among
        the prompt's ``rollout.n``), else the engine's generator."""
        if not self.cfg.rollout.seeded_sampling:
            return self.spec
        n, seed = self.cfg.rollout.n, self.cfg.trainer.seed
        seeds = tuple(sample_seed(seed, step, index, number)
                      for index in prompt_indices for number in range(n))
        return dataclasses.replace(self.spec, seeds=seeds)

    def train_on(self, engine: TrainEngine, experience: Experience) -> dict[str, float]:
        """The update on ``experience`` (this rank's share of the step's samples): advantages,
        the log-probs each pass needs, ``ppo_epochs`` x mini-batch optimizer steps; the step's
        metrics (the rollout's included)."""
        n = self.cfg.rollout.n
        samples, rewards, texts = experience.samples, experience.rewards, experience.texts
        responses = [self._decode(s) for s in samples]
        self._records = self._sample_records("train", texts, samples, responses,
                                             rewards.tolist(), group_size=n)
        advantages = compute_advantages(self.estimator, rewards, group_size=n, cfg=self.cfg)
        started = time.perf_counter()
        batches = self._micro_batches(engine, samples, advantages)
        algorithm = self.cfg.algorithm
        # a correction weighs by the trainer's old log-probs: they are recomputed, as they are
        # when the samples may come from an older policy (a plugin's `ExperienceSource`)
        on_policy = (self._updates(batches) == 1 and algorithm.old_logprobs == "auto"
                     and algorithm.rollout_correction == "none"
                     and (self.source is None or self.source.on_policy))
        mismatch = self._add_logprobs(engine, batches, samples, on_policy=on_policy)
        metrics = {**self._update(engine, batches, on_policy=on_policy), **mismatch}
        update_s = time.perf_counter() - started
        metrics.update(rollout_metrics(samples, rewards, env=self.env, rollout_s=experience.rollout_s,
                                       update_s=update_s, max_new_tokens=self.spec.max_new_tokens,
                                       eos_token_id=self.tokenizer.eos_token_id))
        metrics.update(experience.metrics)
        return metrics

    def _score(self, responses: list[str], texts: list[Any],
               episodes: EpisodeBatch | None) -> list[float]:
        """Each response's reward: the configured reward's; with a plugin's runner its batch's
        (`graft.rollout.EpisodeBatch.total_rewards`: for graft-multiturn's episodes the
        environment's, 0 after an environment failure, plus the configured reward's where the
        episode asks for it)."""
        if episodes is None:
            return self.rewards.score(responses, texts)
        return episodes.total_rewards(self.rewards.score, responses, texts)

    def after_step(self, engine: TrainEngine, *, step: int, total_steps: int) -> dict[str, float]:
        """After step ``step`` (and before the first, ``step`` 0; every rank): write its samples,
        validate when due (`graft.training.job.validation_due`); return the ``val/*`` metrics."""
        records, metrics = self._records, {}
        self._records = []
        every = self.cfg.trainer.val_every_steps
        if self.validator is not None and validation_due(step, every=every,
                                                         total_steps=total_steps):
            result = self.validator.run(self.rollout, score=self.rewards.score,
                                        decode=self._decode, step=step, episodes=self.episodes)
            metrics = result.metrics
            records = records + self._sample_records("val", result.samples, result.generated,
                                                     result.responses, result.rewards,
                                                     group_size=self.cfg.val.n)
            if self.env.is_main:
                console_print(f"validation (step {step}): " + "  ".join(
                    f"{key.removeprefix('val/')} {value:.4g}" for key, value in metrics.items()))
        self.sample_log.write(step, records)
        shown = self.cfg.trainer.print_sample_every_steps
        if records and self.env.is_main and shown and step % shown == 0:
            console_print(format_sample(step, records[0]))
        return metrics

    def _sample_records(self, split: str, samples: Sequence[Any],
                        generated: Sequence[RolloutSample], responses: list[str],
                        rewards: list[float], *, group_size: int) -> list[dict[str, Any]]:
        """The first ``trainer.log_samples`` prompts' records (rank 0; none elsewhere), each
        with the prompt the model saw (``generated``: an environment's ``reset`` included) and
        one or every response (``trainer.log_sample_responses``)."""
        count = self.cfg.trainer.log_samples
        if not self.env.is_main or count == 0:
            return []
        shown = [shown_to_model(s, self.tokenizer) for s in generated[:count * group_size]]
        return sample_records(split, samples, shown, responses, rewards, group_size=group_size,
                              count=count,
                              every_response=self.cfg.trainer.log_sample_responses == "all")

    def _decode(self, sample: RolloutSample) -> str:
        return self.tokenizer.decode(sample.response_ids, skip_special_tokens=True)

    def _micro_batches(self, engine: TrainEngine, samples: Sequence[RolloutSample],
                       advantages: torch.Tensor) -> list[MicroBatch]:
        tokens = [TokenSample(s.prompt_ids + s.response_ids, len(s.prompt_ids), s.loss_mask)
                  for s in samples]
        extras: dict[str, list[torch.Tensor]] = {
            "advantages": [torch.full((len(t),), float(a)) for t, a in zip(tokens, advantages,
                                                                        strict=True)]}
        if all(s.logprobs is not None for s in samples):
            extras["rollout_logprobs"] = [label_aligned(s, s.logprobs) for s in samples]
        for name in samples[0].extras if samples else ():
            extras[name] = [s.extras[name] for s in samples]
        return engine.micro_batches(tokens, extras=extras,
                                    temperatures=[self.spec.temperature] * len(tokens))

    def _updates(self, batches: list[MicroBatch]) -> int:
        """Optimizer steps this RL step takes: ``ppo_epochs`` x mini-batches."""
        algorithm = self.cfg.algorithm
        return algorithm.ppo_epochs * max(1, min(algorithm.mini_batches, len(batches)))

    def _add_logprobs(self, engine: TrainEngine, batches: list[MicroBatch],
                      samples: Sequence[RolloutSample], *, on_policy: bool) -> dict[str, float]:
        """The trainer's log-probs each pass needs, stored in the micro-batches.

        The engine's log-probs when it gave none (phase ``rollout_logprobs``); the old log-probs
        unless the step is on-policy (phase ``old_logprobs``), with the train-inference
        mismatch and the correction's weights (`graft.rl.corrections.apply_correction`); the
        reference's for the KL penalty (phase ``ref_logprobs``). The grids are stored as they
        come (pad positions hold real log-probs, not 0): the loss reads them through
        ``to_sequences``, which zeroes the pad.
        """
        if not all(s.logprobs is not None for s in samples):
            for batch, logp in zip(batches, engine.logprobs(batches, phase=ROLLOUT_LOGPROBS),
                                   strict=True):
                batch.tensors["rollout_logprobs"] = logp
        mismatch = {}
        if not on_policy:
            olds = engine.logprobs(batches, phase=OLD_LOGPROBS)
            for batch, old in zip(batches, olds, strict=True):
                batch.tensors["old_logprobs"] = old
            mismatch = mismatch_metrics(batches, self.env)
            if self.correction is not None:
                mismatch.update(apply_correction(batches, self.correction, self.env,
                                                 cfg=self.cfg))
        if self.reference is not None:
            for batch, ref in zip(batches, self.reference.logprobs(batches, phase=REF_LOGPROBS),
                                  strict=True):
                batch.tensors["ref_logprobs"] = ref
        return mismatch

    def _update(self, engine: TrainEngine, batches: list[MicroBatch], *,
                on_policy: bool) -> dict[str, float]:
        """``ppo_epochs`` passes, ``mini_batches`` optimizer steps each; metrics averaged
        (``skipped_updates``: the optimizer steps skipped for a non-finite gradient norm)."""
        algorithm = self.cfg.algorithm
        groups = max(1, min(algorithm.mini_batches, len(batches)))
        loss_fn = rl_loss(cfg=self.cfg, on_policy=on_policy)
        scale = loss_scale_factor(self.cfg)
        results, norms, skipped = [], [], engine.skipped_updates
        for _ in range(algorithm.ppo_epochs):
            for group in range(groups):
                chunk = batches[group::groups]
                pending = engine.forward_backward(chunk, loss_fn, loss_scale_factor=scale,
                                                  with_entropy=True)
                norms.append(engine.optimizer_step())
                results.append(pending.result())
        tokens = sum(r.tokens for r in results[:groups])  # one pass over the rollout batch
        metrics = {"loss": sum(r.loss for r in results) / len(results),
                   "grad_norm": sum(float(n) for n in norms) / len(norms), "tokens": tokens,
                   "skipped_updates": float(engine.skipped_updates - skipped)}
        for name in results[0].metrics:
            metrics[name] = sum(r.metrics[name] for r in results) / len(results)
        return metrics

    def state_dict(self) -> dict[str, Any]:
        """The prompt position and the steps done (for checkpoints), and a plugin's
        `ExperienceSource` state."""
        state = {"sampler": self.sampler.state_dict(), "steps": self.steps_done}
        if self.source is not None:
            state["source"] = self.source.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved prompt position (a checkpoint older than the step count
        counts from 0)."""
        self.sampler.load_state_dict(state["sampler"])
        self.steps_done = int(state.get("steps", 0))
        self._source_state = state.get("source")

    def close(self) -> None:
        """Stop the rollout engine and the reward workers, and drop the frozen reference (at
        the end of a run)."""
        self.rewards.close()
        if self.rollout is not None:
            self.rollout.close()
        if self.source is not None:
            self.source.close()
        self.rollout = self.reference = self.source = None


def _validator(tokenizer: Any, env: DistEnv, *, cfg: GraftConfig) -> Validator | None:
    """The held-out set's validator, when there is one and validation is on."""
    if cfg.trainer.val_every_steps == 0 or not cfg.data.val_path:
        return None
    return Validator(load_validation_prompts(cfg.data, tokenizer), env, val=cfg.val,
                     trainer=cfg.trainer, rollout=cfg.rollout)


def build_reference(env: DistEnv, engine: TrainEngine, *, cfg: GraftConfig) -> TrainEngine:
    """A frozen copy of the initial policy (same seed, or the same checkpoint directory),
    sharded like the policy (``graft_pre_shard`` sees ``role="reference"``), for the KL
    penalty; it has no optimizer. ``cfg`` is the root config, as for the policy."""
    model, family = build_parallel_model(env, cfg=cfg, role="reference")
    return TrainEngine(model, family, None, None, env, cfg, engine.compute_dtype,
                       engine.pad_token_id)
