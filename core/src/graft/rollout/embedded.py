"""The embedded rollout engine: the trained model generates, with a KV cache.

``rollout.decode=dynamic``: the trainer's own (FSDP2) model generates with a growing cache.
Every rank generates for its own prompts; with several ranks ``synced_gpus`` keeps them stepping
together (each decode step runs FSDP2 collectives). During generation the parameters stay
gathered (``reshard_after_forward`` off), so decoding does not all-gather every block per token.

``rollout.decode=static``: a plain copy of the weights in the compute dtype
(`graft.rollout.inference_copy.InferenceCopy`, refreshed after every update) generates with a
static cache, which transformers compiles on GPU as ``rollout.decode_compile`` says; ranks
generate independently. A plugin may supply the loop the copy decodes with instead
(``graft_static_decoder``: graft-graphed-decode's replays the decode step from a CUDA graph, for
models it can run, with ``rollout.decode_compile=cudagraphs``).

Generation and its log-probs run inside the plugins' ``graft_compute`` wrappers (steps
``generate``, ``prefill``, ``decode``, ``sample_logprobs``), as the trainer's forward does
(graft-exact's batch-invariant kernels: the log-probs are the trainer's bit for bit).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

from graft.engine.head.logprobs import token_logprobs
from graft.engine.phase import GENERATE, ROLLOUT, SAMPLE_LOGPROBS, compute
from graft.rollout.types import RolloutSample, SamplingSpec, cut_at_eos, refuse_extras

if TYPE_CHECKING:
    from graft.config.schema import GraftConfig

T = TypeVar("T")


class EmbeddedRollout:
    """Samples from the model being trained; its weights are always current. ``cfg`` is the
    root config the plugins' hooks get (``graft_compute``, ``graft_inference_copy``)."""

    kind = "embedded"
    llm = None

    def __init__(self, model: torch.nn.Module, *, pad_token_id: int, eos_token_id: int,
                 device: torch.device, reshard_blocks: bool = True,
                 static_copy_dtype: torch.dtype | None = None,
                 logits_dtype: torch.dtype | None = None,
                 compile_backend: str = "inductor", left_padding_exact: bool = True,
                 cfg: GraftConfig | None = None, group: dist.ProcessGroup | None = None) -> None:
        self.model = model
        # transformers' ``generate`` hands back fp32 copies of the logits the model computed in
        # ``logits_dtype``: cast back (no rounding), they take the log-prob kernel the trainer's
        # logits take, whose sums a GPU groups by the dtype it reads
        self.logits_dtype = logits_dtype
        self.group = group  # the ranks that generate together (None: all)
        self.cfg = cfg
        self.left_padding_exact = left_padding_exact
        self.reshard_blocks = reshard_blocks
        self.pad_token_id = pad_token_id
        self.eos_token_id = eos_token_id
        self.device = device
        self.copy = None
        # a plugin's decode loop for the static copy (``graft_static_decoder``): ``generate(ids,
        # mask, spec) -> (tokens, logprobs)``; None: transformers' ``generate``
        self.decoder = None
        if static_copy_dtype is not None:
            from graft.plugins import get_plugin_manager
            from graft.rollout.inference_copy import InferenceCopy

            self.copy = InferenceCopy(model, dtype=static_copy_dtype, device=device,
                                      compile_backend=compile_backend, cfg=cfg)
            self.decoder = get_plugin_manager().hook.graft_static_decoder(
                model=self.copy.model, pad_token_id=pad_token_id, eos_token_id=eos_token_id,
                device=device, decode_compile=compile_backend, cfg=cfg)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], spec: SamplingSpec) -> list[RolloutSample]:
        """Batched sampling (left-padded prompts) with temperature, top-p and a token cap.

        For a family whose outputs change when a prompt is left-padded
        (``ModelFamily.left_padding_exact`` false), prompts of one length generate together.
        """
        if self.left_padding_exact:
            return self._generate(prompts, spec)
        samples: list[RolloutSample | None] = [None] * len(prompts)
        for length in self._lengths(prompts):
            rows = [i for i, prompt in enumerate(prompts) if len(prompt) == length]
            # A rank without prompts of a length another rank has still steps along with it
            # (FSDP collectives in every decode step): one stand-in prompt, dropped.
            batch = [prompts[i] for i in rows] or [[self.pad_token_id] * length]
            seeds = (None if spec.seeds is None
                     else tuple(spec.seeds[i] for i in rows) or (0,))
            for row, sample in zip(rows, self._generate(batch, replace(spec, seeds=seeds)),
                                   strict=False):
                samples[row] = sample
        return samples

    def _lengths(self, prompts: list[list[int]]) -> list[int]:
        """The prompt lengths to generate for, agreed by every rank that decodes in step."""
        lengths = {len(p) for p in prompts}
        if self.copy is None and self._in_step():
            every: list[set[int]] = [set() for _ in range(dist.get_world_size(self.group))]
            dist.all_gather_object(every, lengths, group=self.group)
            lengths = set().union(*every)
        return sorted(lengths)

    def _in_step(self) -> bool:
        """Whether other ranks decode in step with this one (the sharded model's collectives)."""
        return dist.is_initialized() and dist.get_world_size(self.group) > 1

    def _generate(self, prompts: list[list[int]], spec: SamplingSpec) -> list[RolloutSample]:
        ids, mask = self._left_pad(prompts)
        if self.decoder is not None:
            new_tokens, logprobs = self.decoder.generate(ids, mask, spec)
        else:
            new_tokens, logprobs = self._generate_hf(ids, mask, spec)
        responses = [cut_at_eos(row, self.eos_token_id) for row in new_tokens.tolist()]
        logprobs = logprobs.cpu()  # one device-to-host copy for the whole batch
        return [RolloutSample(prompt, response, logprobs[row, :len(response)])
                for row, (prompt, response) in enumerate(zip(prompts, responses, strict=True))]

    def _generate_hf(self, ids: torch.Tensor, mask: torch.Tensor,
                     spec: SamplingSpec) -> tuple[torch.Tensor, torch.Tensor]:
        """transformers' ``generate``: the new tokens and their log-probs, ``(batch, steps)``
        (temperature 0: greedy, log-probs at temperature 1)."""
        sampling = (dict(do_sample=True, temperature=spec.temperature, top_p=spec.top_p, top_k=0)
                    if spec.temperature > 0 else greedy_options())
        if spec.seeds is not None and spec.temperature > 0:
            from transformers import LogitsProcessorList

            from graft.rollout.seeded import SeededSampler

            sampler = SeededSampler(spec.seeds, temperature=spec.temperature, top_p=spec.top_p,
                                    device=ids.device)
            sampling = dict(greedy_options(), logits_processor=LogitsProcessorList([sampler]))
        options = dict(input_ids=ids, attention_mask=mask, **sampling,
                       max_new_tokens=spec.max_new_tokens, use_cache=True,
                       pad_token_id=self.pad_token_id, eos_token_id=self.eos_token_id,
                       return_dict_in_generate=True, output_logits=True)
        model = self.model if self.copy is None else self.copy.model
        if self.copy is not None:
            out = self._compute(GENERATE, model, lambda: model.generate(
                **options, **self.copy.cache_options()))
        else:
            model.eval()
            with GatheredParameters(model, reshard_blocks=self.reshard_blocks):
                out = self._compute(GENERATE, model, lambda: model.generate(
                    **options, synced_gpus=self._in_step()))
        new_tokens = out.sequences[:, ids.shape[1]:]
        # One decode step at a time, with the trainer's own log-prob function: never a fp32 copy
        # of all (sequences x steps x vocab) logits.
        temperature = torch.full((ids.shape[0],), spec.temperature or 1.0,
                                 device=new_tokens.device)
        dtype = self.logits_dtype
        logprobs = self._compute(SAMPLE_LOGPROBS, model, lambda: torch.stack(
            [token_logprobs(step if dtype is None else step.to(dtype), new_tokens[:, i],
                            temperature)
             for i, step in enumerate(out.logits)], dim=1))
        return new_tokens, logprobs

    def _compute(self, step: str, model: torch.nn.Module, run: Callable[[], T]) -> T:
        """``run()``, a ``step`` of ``model``'s generation, inside the plugins' graft_compute."""
        return compute(step, run, phase=ROLLOUT, model=model, cfg=self.cfg)

    def request_extras(self, *names: str) -> None:
        """No per-request outputs: plugins record what they need with hooks on `model`."""
        refuse_extras(self.kind, names)

    def sync_weights(self) -> dict[str, float]:
        """Nothing to do when the trained model generates; refresh the static copy otherwise."""
        if self.copy is None:
            return {"weight_sync_s": 0.0}
        import time

        started = time.perf_counter()
        self.copy.refresh()
        return {"weight_sync_s": time.perf_counter() - started}

    def close(self) -> None:
        """Nothing to release."""

    def _left_pad(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ids, mask)`` on the device, both ``(prompts, longest prompt)``: the prompts padded
        on the left."""
        lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long)
        width = int(lengths.max()) if prompts else 1
        mask = torch.arange(width)[None, :] >= width - lengths[:, None]
        ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        # one tensor for all prompts: a rollout's host time before the first kernel
        ids[mask] = torch.tensor([token for prompt in prompts for token in prompt],
                                 dtype=torch.long)
        return ids.to(self.device), mask.long().to(self.device)


def greedy_options() -> dict[str, Any]:
    """``generate`` options for greedy decoding, whatever the checkpoint's generation_config
    says (Qwen3's samples at temperature 0.6, top-k 20, top-p 0.95)."""
    return dict(do_sample=False, temperature=None, top_p=None, top_k=None)


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
            # as `graft.engine.distributed.parallelize.apply_fsdp` set them: the root stays gathered
            module.set_reshard_after_forward(module is not self.root and self.reshard_blocks,
                                             recurse=False)
