"""The embedded rollout engine: the trainer's own (FSDP2) model generates, with a KV cache.

Every rank generates for its own prompts; with several ranks ``synced_gpus`` keeps them stepping
together (each decode step runs FSDP2 collectives). During generation the parameters stay
gathered (``reshard_after_forward`` off), so decoding does not all-gather every block per token.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

from graft.engine.logprobs import token_logprobs
from graft.rollout.types import RolloutSample, SamplingSpec, cut_at_eos, refuse_extras


class EmbeddedRollout:
    """Samples from the model being trained; its weights are always current."""

    kind = "embedded"
    llm = None

    def __init__(self, model: torch.nn.Module, *, pad_token_id: int, eos_token_id: int,
                 device: torch.device, reshard_blocks: bool = True) -> None:
        self.model = model
        self.reshard_blocks = reshard_blocks
        self.pad_token_id = pad_token_id
        self.eos_token_id = eos_token_id
        self.device = device

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], spec: SamplingSpec) -> list[RolloutSample]:
        """Batched sampling (left-padded prompts) with temperature, top-p and a token cap."""
        ids, mask = self._left_pad(prompts)
        self.model.eval()
        with GatheredParameters(self.model, reshard_blocks=self.reshard_blocks):
            out = self.model.generate(
                input_ids=ids, attention_mask=mask, do_sample=True, temperature=spec.temperature,
                top_p=spec.top_p, top_k=0, max_new_tokens=spec.max_new_tokens, use_cache=True,
                pad_token_id=self.pad_token_id, eos_token_id=self.eos_token_id,
                return_dict_in_generate=True, output_logits=True,
                synced_gpus=dist.is_initialized() and dist.get_world_size() > 1)
        new_tokens = out.sequences[:, ids.shape[1]:]
        # One decode step at a time, with the trainer's own log-prob function: never a fp32 copy
        # of all (sequences x steps x vocab) logits.
        temperature = torch.full((len(prompts),), spec.temperature, device=new_tokens.device)
        logprobs = torch.stack([token_logprobs(step, new_tokens[:, i], temperature)
                                for i, step in enumerate(out.logits)], dim=1)
        samples = []
        for row, prompt in enumerate(prompts):
            response = cut_at_eos(new_tokens[row].tolist(), self.eos_token_id)
            samples.append(RolloutSample(prompt, response, logprobs[row, :len(response)].cpu()))
        return samples

    def request_extras(self, *names: str) -> None:
        """No per-request outputs: plugins record what they need with hooks on `model`."""
        refuse_extras(self.kind, names)

    def sync_weights(self) -> dict[str, float]:
        """Nothing to do: the engine is the trained model."""
        return {"weight_sync_s": 0.0}

    def close(self) -> None:
        """Nothing to release."""

    def _left_pad(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max((len(p) for p in prompts), default=1)
        ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt):] = torch.tensor(prompt)
            mask[row, width - len(prompt):] = 1
        return ids.to(self.device), mask.to(self.device)


class GatheredParameters:
    """Keep FSDP2 parameters unsharded across forwards (generation), reshard afterwards."""

    def __init__(self, model: torch.nn.Module, *, reshard_blocks: bool) -> None:
        self.root = model
        self.modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
        self.reshard_blocks = reshard_blocks

    def __enter__(self) -> None:
        for module in self.modules:
            module.set_reshard_after_forward(False, recurse=False)

    def __exit__(self, *exc: Any) -> None:
        for module in self.modules:
            module.reshard()
            # as `graft.engine.parallelize.apply_fsdp` set them: the root stays gathered
            module.set_reshard_after_forward(module is not self.root and self.reshard_blocks,
                                             recurse=False)
