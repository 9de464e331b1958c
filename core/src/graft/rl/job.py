"""The RL step: generate, score, compute advantages, recompute log-probs, update, push weights.

Each rank takes its share of the step's prompts, generates ``rollout.n`` samples per prompt, and
trains on them with the configured policy loss and ``loss.loss_agg_mode`` (normalisers global
over each mini-batch). The old log-probs are recomputed when the step updates more than once
(``algorithm.ppo_epochs`` x ``algorithm.mini_batches`` > 1; with a single update they equal the
update's own: the ratio is 1 by construction) and with an off-policy correction
(``algorithm.rollout_correction``, `graft.rl.corrections`), which weights each token's policy
loss by the ratio of the old log-probs to the rollout's. After the update the rollout engine
receives the new weights. With a held-out set the job validates (`graft.rl.validation`) and it
writes a few of each step's generations to ``samples.jsonl`` (`graft.training.samples`), in
`after_step`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from graft.data.dataset import load_prompts, load_validation_prompts
from graft.data.sampler import EpochSampler
from graft.engine.batch.micro_batch import MicroBatch, TokenSample
from graft.engine.distributed.env import DistEnv, all_reduce, share_within_sp
from graft.engine.distributed.parallelize import build_parallel_model
from graft.engine.phase import OLD_LOGPROBS, REF_LOGPROBS, ROLLOUT_LOGPROBS
from graft.engine.train_engine import LossFn, TrainEngine
from graft.losses.aggregation import loss_scale_factor
from graft.losses.contract import is_token_separable, token_separable
from graft.losses.policy import kl_penalty
from graft.losses.registry import policy_losses
from graft.plugins import get_plugin_manager
from graft.plugins.keywords import call_with_keywords
from graft.rl.advantages import advantage_estimators, compute_advantages
from graft.rl.corrections import WEIGHTS, apply_correction, rollout_corrections
from graft.rl.rewards import RewardScorer
from graft.rl.validation import Validator
from graft.rollout.types import EpisodeBatch, EpisodeRunner, RolloutEngine, RolloutSample, SamplingSpec
from graft.training.job import validation_due
from graft.training.metrics import console_print
from graft.training.samples import SampleLog, format_sample, sample_records, shown_to_model

if TYPE_CHECKING:
    from graft.config.schema import GraftConfig

MISMATCH = "train_infer_logprob_diff"
# share of response tokens whose rollout log-prob equals the trainer's bit for bit
EXACT_FRACTION = "train_infer_logprob_exact_fraction"


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
        # a plugin's runner in place of one generate per prompt (graft-multiturn's episodes)
        self.episodes: EpisodeRunner | None = get_plugin_manager().hook.graft_episode_runner(
            cfg=cfg, tokenizer=tokenizer, env=env)

    def attach(self, engine: TrainEngine, run_dir: Path) -> None:
        """Start the rollout engine (and the frozen reference for the KL penalty)."""
        from graft.rollout.builtin import build_rollout

        self.rollout = build_rollout(cfg=self.cfg, engine=engine, env=self.env, run_dir=run_dir,
                                     tokenizer=self.tokenizer)
        self.sample_log = SampleLog(run_dir, enabled=self.env.is_main
                                    and self.cfg.trainer.log_samples > 0)
        if self.cfg.loss.kl_coef > 0:
            self.reference = build_reference(self.env, engine, cfg=self.cfg)

    def step(self, engine: TrainEngine) -> dict[str, float]:
        """One RL step on this rank's share of ``rollout.prompts_per_step`` prompts."""
        hook = get_plugin_manager().hook
        indices = self.sampler.next_batch(self.cfg.rollout.prompts_per_step)
        local = indices[self.env.dp_rank::self.env.dp_size]
        n = self.cfg.rollout.n
        prompts = [self.prompts[i] for i in local for _ in range(n)]
        kind = self.rollout.kind
        hook.graft_rollout_begin(engine=kind, rollout=self.rollout, cfg=self.cfg,
                                 model=self.rollout.model)
        texts = [self.texts[i] for i in local for _ in range(n)]
        started = time.perf_counter()
        episodes = None
        if self.episodes is not None:
            episodes = self.episodes.run(self.rollout, texts, prompts, self.spec)
            self.episodes.check_failures(episodes)  # a warning; a PluginError after a streak
            samples = episodes.samples
        else:
            samples = self.rollout.generate(prompts, self.spec) if prompts else []
        rollout_s = time.perf_counter() - started
        hook.graft_rollout_end(samples=samples, engine=kind, rollout=self.rollout, cfg=self.cfg)
        # Sequence parallelism: the sp ranks of one data-parallel rank generated for the same
        # prompts; they train on one set of samples (their first rank's), split by sequence.
        samples = share_within_sp(samples, self.env)
        responses = [self._decode(s) for s in samples]
        rewards = torch.tensor(self._score(responses, texts, episodes), dtype=torch.float64)
        self._records = self._sample_records("train", texts, samples, responses,
                                             rewards.tolist(), group_size=n)
        advantages = compute_advantages(self.estimator, rewards, group_size=n, cfg=self.cfg)
        started = time.perf_counter()
        batches = self._micro_batches(engine, samples, advantages)
        algorithm = self.cfg.algorithm
        # a correction weighs by the trainer's old log-probs: they are recomputed
        on_policy = (self._updates(batches) == 1 and algorithm.old_logprobs == "auto"
                     and algorithm.rollout_correction == "none")
        mismatch = self._add_logprobs(engine, batches, samples, on_policy=on_policy)
        metrics = {**self._update(engine, batches, on_policy=on_policy), **mismatch}
        update_s = time.perf_counter() - started
        metrics.update(self.rollout.sync_weights())
        metrics.update(self._rollout_metrics(samples, rewards, rollout_s, update_s))
        metrics.update(self.rewards.metrics())
        if episodes is not None:
            metrics.update(episodes.metrics)
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
            mismatch = self._mismatch(batches)
            if self.correction is not None:
                mismatch.update(apply_correction(batches, self.correction, self.env,
                                                 cfg=self.cfg))
        if self.reference is not None:
            for batch, ref in zip(batches, self.reference.logprobs(batches, phase=REF_LOGPROBS),
                                  strict=True):
                batch.tensors["ref_logprobs"] = ref
        return mismatch

    def _mismatch(self, batches: list[MicroBatch]) -> dict[str, float]:
        """Mean |old - rollout| log-prob per response token and the share of those tokens
        where the two are bit-equal, over all ranks (weighted by the loss mask)."""
        diff_sum = equal = count = 0.0
        for batch in batches:
            mask = batch.tensors["loss_mask"]
            old, rollout = batch.tensors["old_logprobs"], batch.tensors["rollout_logprobs"]
            # `where`, not `* mask`: whatever the pad holds cannot reach the sum (inf * 0 = nan).
            diff = torch.where(mask != 0, (old - rollout).abs() * mask, 0.0)
            diff_sum += float(diff.sum())
            equal += float(torch.where(mask != 0, (old == rollout) * mask, 0.0).sum())
            count += float(mask.sum())
        totals = all_reduce(torch.tensor([diff_sum, equal, count], dtype=torch.float64,
                                         device=self.env.device), group=self.env.dp_group)
        tokens = max(float(totals[2]), 1.0)
        return {MISMATCH: float(totals[0]) / tokens, EXACT_FRACTION: float(totals[1]) / tokens}

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

    def _rollout_metrics(self, samples: Sequence[RolloutSample], rewards: torch.Tensor,
                         rollout_s: float, update_s: float) -> dict[str, float]:
        """The step's rewards, lengths (tokens; a response's counts its environment tokens)
        and timings over all data-parallel ranks; ``response_truncated_fraction`` is the share
        of responses cut at ``rollout.max_new_tokens`` (their last model turn: no ``eos``)."""
        lengths = [len(s.response_ids) for s in samples]
        stats = all_reduce(torch.tensor(
            [float(rewards.sum()), float(rewards.square().sum()), float(len(samples)),
             float(sum(lengths)), float(sum(len(s.prompt_ids) for s in samples)),
             float(sum(self._truncated(s) for s in samples))],
            dtype=torch.float64, device=self.env.device), group=self.env.dp_group)
        # max of the lengths and of their negatives: the longest and the shortest response
        extremes = all_reduce(torch.tensor(
            [max(lengths, default=-math.inf), -min(lengths, default=math.inf)],
            dtype=torch.float64, device=self.env.device), op=dist.ReduceOp.MAX,
            group=self.env.dp_group)
        total, squares, count, generated, prompted, truncated = (float(v) for v in stats)
        count = max(count, 1.0)
        mean = total / count
        longest, shortest = (float(v) if math.isfinite(v) else 0.0
                             for v in (extremes[0], -extremes[1]))
        return {"reward_mean": mean,
                "reward_std": max(squares / count - mean * mean, 0.0) ** 0.5,
                "response_length": generated / count, "response_length_max": longest,
                "response_length_min": shortest, "response_truncated_fraction": truncated / count,
                "prompt_length": prompted / count, "rollout_s": rollout_s,
                "update_s": update_s, "rollout_tokens_per_s": generated / max(rollout_s, 1e-9)}

    def _truncated(self, sample: RolloutSample) -> bool:
        """Whether the response's last model turn (all of a single-turn response) ran to
        ``rollout.max_new_tokens`` without ``eos``."""
        turn = sample.response_ids
        if sample.loss_mask is not None:  # an episode: its last run of model tokens
            model = sample.loss_mask.tolist()
            end = max((i + 1 for i, m in enumerate(model) if m), default=0)
            start = end
            while start > 0 and model[start - 1]:
                start -= 1
            turn = turn[start:end]
        return (len(turn) >= self.spec.max_new_tokens
                and turn[-1] != self.tokenizer.eos_token_id)

    def state_dict(self) -> dict[str, Any]:
        """The prompt position (for checkpoints)."""
        return {"sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved prompt position."""
        self.sampler.load_state_dict(state["sampler"])

    def close(self) -> None:
        """Stop the rollout engine and the reward workers, and drop the frozen reference (at
        the end of a run)."""
        self.rewards.close()
        if self.rollout is not None:
            self.rollout.close()
        self.rollout = self.reference = None


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
