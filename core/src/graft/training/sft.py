"""Supervised fine-tuning: one step = one global batch of prompt/response samples."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from graft.data.dataset import load_text_samples, tokenize_sft
from graft.data.sampler import EpochSampler
from graft.engine.distributed import DistEnv
from graft.engine.phase import SFT
from graft.engine.train_engine import TrainEngine
from graft.losses.aggregation import loss_scale_factor
from graft.losses.separable import token_separable

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@token_separable
def sft_loss(logp: torch.Tensor, tensors: Mapping[str, torch.Tensor],
             mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The per-token negative log-likelihood of the response tokens (the engine masks and
    aggregates it)."""
    return -logp, {}


class SFTJob:
    """Tokenized dataset, sampler, and the step that trains on one global batch."""

    def __init__(self, cfg: Any, tokenizer: PreTrainedTokenizerBase, env: DistEnv) -> None:
        self.cfg = cfg
        self.env = env
        data = cfg.data
        texts = load_text_samples(data, seed=cfg.trainer.seed, require_response=True)
        self.samples = tokenize_sft(texts, tokenizer, max_prompt_tokens=data.max_prompt_tokens,
                                    max_response_tokens=data.max_response_tokens,
                                    chat_template=data.chat_template,
                                    overlong_prompts=data.overlong_prompts)
        self.sampler = EpochSampler(len(self.samples), seed=cfg.trainer.seed, shuffle=data.shuffle)

    def attach(self, engine: TrainEngine, run_dir: Any) -> None:
        """Nothing to start: SFT needs no generator."""

    def step(self, engine: TrainEngine) -> dict[str, float]:
        """Train on the next global batch; this rank takes every ``dp_size``-th sample."""
        indices = self.sampler.next_batch(self.cfg.trainer.global_batch_size)
        local = [self.samples[i] for i in indices[self.env.dp_rank::self.env.dp_size]]
        pending = engine.forward_backward(engine.micro_batches(local), sft_loss,
                                          loss_scale_factor=loss_scale_factor(self.cfg),
                                          phase=SFT)
        grad_norm = engine.optimizer_step()
        result = pending.result()
        return {"loss": result.loss, "grad_norm": float(grad_norm), "tokens": result.tokens,
                **result.metrics}

    def state_dict(self) -> dict[str, Any]:
        """The data position (for checkpoints)."""
        return {"sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved data position."""
        self.sampler.load_state_dict(state["sampler"])

    def close(self) -> None:
        """Nothing to release: the SFT job holds only its data and sampler."""
