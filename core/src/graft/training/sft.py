"""Supervised fine-tuning: one step = one global batch of prompt/response samples.

Data: Graft's and TRL's SFT layouts (`graft.data.records.sft_records_to_samples`); chat
completions train their assistant turns only (`graft.data.conversations`). Every step's
metrics hold ``epoch``: samples drawn so far over the dataset's size.

Validation: with ``data.val_path`` and ``trainer.val_every_steps`` > 0 the job computes
``val/loss``, the mean negative log-likelihood per trained token of the held-out set (the
first ``val.max_prompts`` samples; default all), before the first step, every
``val_every_steps`` steps and after the last (`graft.training.job.validation_due`, as RL). Each
data-parallel rank scores its share and the sums are all-reduced. It runs without gradients and
leaves the optimizer, the schedule and the RNG alone, so the training losses are the same with
validation on or off. Its forward is told ``ref_logprobs`` (plugins' forward hooks): a no-grad
pass with the model's own weights and routing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from graft.data.dataset import TRAIN, VAL, load_text_samples, tokenize_sft
from graft.data.sampler import EpochSampler
from graft.engine.batch.micro_batch import TokenSample
from graft.engine.distributed.env import DistEnv, all_reduce
from graft.engine.phase import REF_LOGPROBS, SFT
from graft.engine.train_engine import TrainEngine
from graft.losses.aggregation import loss_scale_factor
from graft.losses.contract import token_separable
from graft.training.job import validation_due
from graft.training.metrics import console_print

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

VAL_LOSS = "val/loss"


@token_separable
def sft_loss(logp: torch.Tensor, tensors: Mapping[str, torch.Tensor],
             mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The per-token negative log-likelihood of the response tokens (the engine masks and
    aggregates it)."""
    return -logp, {}


def load_sft_samples(cfg: Any, tokenizer: PreTrainedTokenizerBase, *,
                     split: str = TRAIN) -> list[TokenSample]:
    """The token samples of ``split`` (``train``: ``data.source`` / ``data.path``; ``val``:
    ``data.val_path``, its first ``val.max_prompts``) under the ``data`` settings."""
    data = cfg.data
    texts = load_text_samples(data, seed=cfg.trainer.seed, require_response=True, split=split)
    if split == VAL and cfg.val.max_prompts:
        texts = texts[:cfg.val.max_prompts]
    return tokenize_sft(texts, tokenizer, max_prompt_tokens=data.max_prompt_tokens,
                        max_response_tokens=data.max_response_tokens,
                        chat_template=data.chat_template, overlong_prompts=data.overlong_prompts)


@torch.no_grad()
def validation_loss(engine: TrainEngine, samples: Sequence[TokenSample], env: DistEnv) -> float:
    """The mean NLL per trained token of every rank's ``samples`` (this rank's share; every
    rank calls it), in nats. No gradients; the optimizer is not touched."""
    batches = engine.micro_batches(samples)
    totals = torch.zeros(2, dtype=torch.float64)
    for batch, logp in zip(batches, engine.logprobs(batches, phase=REF_LOGPROBS), strict=True):
        mask = batch.tensors["loss_mask"].double()
        # pad positions may hold -inf: zero them before weighting
        nll = torch.where(mask > 0, -logp.double(), torch.zeros((), dtype=torch.float64))
        totals += torch.stack([(nll * mask).sum(), mask.sum()])
    nll_sum, tokens = all_reduce(totals.to(env.device), group=env.dp_group).tolist()
    return nll_sum / max(tokens, 1.0)


class SFTJob:
    """Tokenized dataset, sampler, and the step that trains on one global batch; the held-out
    set's loss after the steps it is due."""

    def __init__(self, cfg: Any, tokenizer: PreTrainedTokenizerBase, env: DistEnv) -> None:
        self.cfg = cfg
        self.env = env
        self.samples = load_sft_samples(cfg, tokenizer)
        self.sampler = EpochSampler(len(self.samples), seed=cfg.trainer.seed,
                                    shuffle=cfg.data.shuffle)
        validates = cfg.data.val_path and cfg.trainer.val_every_steps > 0
        self.val_samples = load_sft_samples(cfg, tokenizer, split=VAL) if validates else None

    def attach(self, engine: TrainEngine, run_dir: Any) -> None:
        """Nothing to start: SFT needs no generator."""

    def step(self, engine: TrainEngine) -> dict[str, float]:
        """Train on the next global batch; this rank takes every ``dp_size``-th sample."""
        indices = self.sampler.next_batch(self.cfg.trainer.global_batch_size)
        local = [self.samples[i] for i in indices[self.env.dp_rank::self.env.dp_size]]
        pending = engine.forward_backward(engine.micro_batches(local), sft_loss,
                                          loss_scale_factor=loss_scale_factor(self.cfg),
                                          phase=SFT)
        skipped = engine.skipped_updates
        grad_norm = engine.optimizer_step()
        result = pending.result()
        return {"loss": result.loss, "grad_norm": float(grad_norm), "tokens": result.tokens,
                "epoch": self.sampler.epochs_done(),
                "skipped_updates": float(engine.skipped_updates - skipped), **result.metrics}

    def after_step(self, engine: TrainEngine, *, step: int, total_steps: int
                   ) -> dict[str, float]:
        """After step ``step`` (0: before the first; every rank): ``val/loss`` when validation
        is due (`graft.training.job.validation_due`), else nothing."""
        every = self.cfg.trainer.val_every_steps
        if self.val_samples is None or not validation_due(step, every=every,
                                                          total_steps=total_steps):
            return {}
        share = self.val_samples[self.env.dp_rank::self.env.dp_size]
        loss = validation_loss(engine, share, self.env)
        if self.env.is_main:
            console_print(f"validation (step {step}): loss {loss:.4g}")
        return {VAL_LOSS: loss}

    def state_dict(self) -> dict[str, Any]:
        """The data position (for checkpoints)."""
        return {"sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved data position."""
        self.sampler.load_state_dict(state["sampler"])

    def close(self) -> None:
        """Nothing to release: the SFT job holds only its data and sampler."""
