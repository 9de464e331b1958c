"""The RL step: generate, score, compute advantages, recompute log-probs, update, push weights.

Each rank takes its share of the step's prompts, generates ``rollout.n`` samples per prompt, and
trains on them with the configured policy loss and ``loss.loss_agg_mode`` (normalisers global
over each mini-batch). After the update the rollout engine receives the new weights.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from graft.data.dataset import encode_prompt, load_text_samples
from graft.data.sampler import EpochSampler
from graft.engine.distributed import DistEnv, all_reduce
from graft.engine.micro_batch import MicroBatch, TokenSample
from graft.engine.train_engine import LossFn, TrainEngine
from graft.losses.registry import policy_losses
from graft.plugins import get_plugin_manager
from graft.rl.advantages import group_advantages
from graft.rl.kl import kl_penalty
from graft.rl.rewards import resolve_reward
from graft.rollout.types import RolloutEngine, RolloutSample, SamplingSpec


def rl_loss(loss_cfg: Any) -> LossFn:
    """The configured policy loss plus the KL penalty (``loss.kl_coef``) per token."""
    policy = policy_losses()[loss_cfg.policy_loss]

    def loss_fn(logp: torch.Tensor, tensors: Mapping[str, torch.Tensor],
                mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss, metrics = policy(logp=logp, old_logp=tensors["old_logprobs"],
                               advantages=tensors["advantages"], mask=mask, cfg=loss_cfg)
        if loss_cfg.kl_coef > 0:
            kl = kl_penalty(logp, tensors["ref_logprobs"], loss_cfg.kl_type)
            loss = loss + loss_cfg.kl_coef * kl
            metrics = {**metrics, "kl": kl.detach()}
        return loss, metrics

    return loss_fn


def label_aligned(sample: RolloutSample, values: torch.Tensor) -> torch.Tensor:
    """Per-response-token values placed where the trainer predicts those tokens (position t
    predicts token t + 1), zeros elsewhere; length ``len(prompt) + len(response)``."""
    out = torch.zeros(len(sample.prompt_ids) + len(sample.response_ids))
    start = len(sample.prompt_ids) - 1
    out[start:start + len(values)] = values.float()
    return out


class RLJob:
    """Prompts, reward, rollout engine and the update of one RL run."""

    def __init__(self, cfg: Any, tokenizer: Any, env: DistEnv) -> None:
        self.cfg = cfg
        self.env = env
        self.tokenizer = tokenizer
        self.texts = load_text_samples(cfg.data, seed=cfg.trainer.seed, require_response=False)
        self.prompts = [encode_prompt(t.prompt, tokenizer, max_tokens=cfg.data.max_prompt_tokens,
                                      index=i) for i, t in enumerate(self.texts)]
        self.sampler = EpochSampler(len(self.texts), seed=cfg.trainer.seed, shuffle=cfg.data.shuffle)
        self.reward = resolve_reward(cfg.algorithm.reward, cfg.data.source)
        self.spec = SamplingSpec(cfg.rollout.temperature, cfg.rollout.top_p,
                                 cfg.rollout.max_new_tokens)
        self.rollout: RolloutEngine | None = None
        self.reference: TrainEngine | None = None

    def attach(self, engine: TrainEngine, run_dir: Path) -> None:
        """Start the rollout engine (and the frozen reference for the KL penalty)."""
        from graft.rl.setup import build_reference, build_rollout

        self.rollout = build_rollout(self.cfg, engine, self.env, run_dir, self.tokenizer)
        if self.cfg.loss.kl_coef > 0:
            self.reference = build_reference(self.cfg, self.env, engine)

    def step(self, engine: TrainEngine) -> dict[str, float]:
        """One RL step on this rank's share of ``rollout.prompts_per_step`` prompts."""
        hook = get_plugin_manager().hook
        indices = self.sampler.next_batch(self.cfg.rollout.prompts_per_step)
        local = indices[self.env.rank::self.env.world_size]
        n = self.cfg.rollout.n
        prompts = [self.prompts[i] for i in local for _ in range(n)]
        hook.graft_rollout_begin(engine=self.rollout.name, cfg=self.cfg,
                                 model=engine.model if self.rollout.name == "embedded" else None)
        started = time.perf_counter()
        samples = self.rollout.generate(prompts, self.spec) if prompts else []
        rollout_s = time.perf_counter() - started
        hook.graft_rollout_end(samples=samples, engine=self.rollout.name, cfg=self.cfg)
        texts = [self.texts[i] for i in local for _ in range(n)]
        rewards = torch.tensor([float(self.reward(self._decode(s), t))
                                for s, t in zip(samples, texts, strict=True)])
        advantages = group_advantages(rewards, n, estimator=self.cfg.algorithm.advantage,
                                      norm_by_std=self.cfg.algorithm.norm_adv_by_std)
        started = time.perf_counter()
        batches = self._micro_batches(engine, samples, advantages)
        mismatch = self._add_old_logprobs(engine, batches)
        metrics = self._update(engine, batches)
        update_s = time.perf_counter() - started
        metrics.update(self.rollout.sync_weights())
        metrics.update(self._rollout_metrics(samples, rewards, rollout_s, update_s), **mismatch)
        return metrics

    def _decode(self, sample: RolloutSample) -> str:
        return self.tokenizer.decode(sample.response_ids, skip_special_tokens=True)

    def _micro_batches(self, engine: TrainEngine, samples: Sequence[RolloutSample],
                       advantages: torch.Tensor) -> list[MicroBatch]:
        tokens = [TokenSample(s.prompt_ids + s.response_ids, len(s.prompt_ids)) for s in samples]
        extras: dict[str, list[torch.Tensor]] = {
            "advantages": [torch.full((len(t),), float(a)) for t, a in zip(tokens, advantages,
                                                                        strict=True)],
            "rollout_logprobs": [label_aligned(s, s.logprobs) for s in samples]}
        for name in samples[0].extras if samples else ():
            extras[name] = [s.extras[name] for s in samples]
        return engine.micro_batches(tokens, extras=extras,
                                    temperatures=[self.spec.temperature] * len(tokens))

    def _add_old_logprobs(self, engine: TrainEngine, batches: list[MicroBatch]) -> dict[str, float]:
        """Recompute the sampled tokens' log-probs with the trainer (and the reference).

        The grids are stored as they come (pad positions hold real log-probs, not 0): the loss
        reads them through ``to_sequences``, which zeroes the pad.
        """
        diff_sum = count = 0.0
        for batch, old in zip(batches, engine.logprobs(batches), strict=True):
            batch.tensors["old_logprobs"] = old
            mask = batch.tensors["loss_mask"]
            # `where`, not `* mask`: whatever the pad holds cannot reach the sum (inf * 0 = nan).
            diff = torch.where(mask != 0, (old - batch.tensors["rollout_logprobs"]).abs() * mask,
                               0.0)
            diff_sum += float(diff.sum())
            count += float(mask.sum())
        if self.reference is not None:
            for batch, ref in zip(batches, self.reference.logprobs(batches), strict=True):
                batch.tensors["ref_logprobs"] = ref
        totals = all_reduce(torch.tensor([diff_sum, count], dtype=torch.float64,
                                         device=self.env.device))
        return {"train_infer_logprob_diff": float(totals[0]) / max(float(totals[1]), 1.0)}

    def _update(self, engine: TrainEngine, batches: list[MicroBatch]) -> dict[str, float]:
        """``ppo_epochs`` passes, ``mini_batches`` optimizer steps each; metrics averaged."""
        algorithm = self.cfg.algorithm
        groups = max(1, min(algorithm.mini_batches, len(batches)))
        loss_fn = rl_loss(self.cfg.loss)
        scale = self.cfg.loss.loss_scale_factor or float(self.cfg.rollout.max_new_tokens)
        results, norms = [], []
        for _ in range(algorithm.ppo_epochs):
            for group in range(groups):
                chunk = batches[group::groups]
                pending = engine.forward_backward(chunk, loss_fn, loss_scale_factor=scale,
                                                  with_entropy=True)
                norms.append(engine.optimizer_step())
                results.append(pending.result())
        tokens = sum(r.tokens for r in results[:groups])  # one pass over the rollout batch
        metrics = {"loss": sum(r.loss for r in results) / len(results),
                   "grad_norm": sum(float(n) for n in norms) / len(norms), "tokens": tokens}
        for name in results[0].metrics:
            metrics[name] = sum(r.metrics[name] for r in results) / len(results)
        return metrics

    def _rollout_metrics(self, samples: Sequence[RolloutSample], rewards: torch.Tensor,
                         rollout_s: float, update_s: float) -> dict[str, float]:
        lengths = sum(len(s.response_ids) for s in samples)
        stats = all_reduce(torch.tensor(
            [float(rewards.sum()), float(rewards.square().sum()), float(len(samples)),
             float(lengths)], dtype=torch.float64, device=self.env.device))
        total, squares, count, generated = (float(v) for v in stats)
        mean = total / max(count, 1.0)
        return {"reward_mean": mean,
                "reward_std": max(squares / max(count, 1.0) - mean * mean, 0.0) ** 0.5,
                "response_length": generated / max(count, 1.0), "rollout_s": rollout_s,
                "update_s": update_s, "rollout_tokens_per_s": generated / max(rollout_s, 1e-9)}

    def state_dict(self) -> dict[str, Any]:
        """The prompt position (for checkpoints)."""
        return {"sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved prompt position."""
        self.sampler.load_state_dict(state["sampler"])

    def close(self) -> None:
        """Stop the rollout engine and drop the frozen reference (at the end of a run)."""
        if self.rollout is not None:
            self.rollout.close()
        self.rollout = self.reference = None
