"""The vLLM rollout engine: a vLLM engine whose weights follow the trainer.

At start the trainer's weights are exported to ``<run_dir>/rollout_init`` (a HF directory) and
vLLM starts from it on rank 0; after every update `sync_weights` streams the new weights into it
(`graft.export.sinks.vllm.VLLMSink`; only changed rows with ``export.delta``). With a single
trainer process the engine runs inside it; under torchrun it runs in its own process, generates
for every rank's prompts (gathered to rank 0) and hands the samples back.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from graft.engine.distributed import DistEnv, broadcast_object
from graft.export.hf import export_model_to_hf
from graft.export.sinks.vllm import VLLMSink, safetensors_shapes
from graft.export.stream import WeightExporter, default_bucket_bytes
from graft.inference.vllm_engine import shutdown_engine, start_engine
from graft.rollout.types import RolloutSample, SamplingSpec, cut_at_eos


class VLLMRollout:
    """Generates with vLLM on rank 0; `sync_weights` pushes the trainer's weights into it."""

    name = "vllm"

    def __init__(self, model: torch.nn.Module, *, compute_dtype: torch.dtype, cfg: Any,
                 env: DistEnv, run_dir: Path, tokenizer: Any) -> None:
        self.env = env
        self.eos_token_id = tokenizer.eos_token_id
        device = next(model.parameters()).device
        # vLLM computes in the trainer's compute dtype, so log-probs agree to rounding.
        dtype_name = str(compute_dtype).removeprefix("torch.")
        init_dir = run_dir / "rollout_init"
        export_model_to_hf(model, init_dir, tokenizer=tokenizer, is_main=env.is_main,
                           export_cfg=dataclasses.replace(cfg.export, dtype=dtype_name))
        self.llm = self.sink = None
        if env.is_main:
            self.llm = start_engine(init_dir, dtype=dtype_name, seed=cfg.trainer.seed,
                                    max_model_len=cfg.rollout.max_model_len,
                                    gpu_memory_utilization=cfg.rollout.gpu_memory_utilization,
                                    in_process=env.world_size == 1)
            self.sink = VLLMSink(self.llm, safetensors_shapes(init_dir))
        self.exporter = WeightExporter(
            model, bucket_bytes=default_bucket_bytes(cfg.export.bucket_mb, device),
            dtype=compute_dtype, delta=cfg.export.delta, is_main=env.is_main)
        if cfg.export.delta:
            self.exporter.export(self.sink)  # the delta baseline: what the engine holds now

    def generate(self, prompts: list[list[int]], spec: SamplingSpec) -> list[RolloutSample]:
        """One sample per prompt; every rank's prompts are generated together on rank 0."""
        if self.env.world_size == 1:
            return self._generate(prompts, spec)
        per_rank: list[list[list[int]]] = [[] for _ in range(self.env.world_size)]
        dist.all_gather_object(per_rank, prompts)
        results = None
        if self.env.is_main:
            flat = self._generate([p for rank_prompts in per_rank for p in rank_prompts], spec)
            offsets = [0]
            for rank_prompts in per_rank:
                offsets.append(offsets[-1] + len(rank_prompts))
            results = [flat[offsets[r]:offsets[r + 1]] for r in range(self.env.world_size)]
        return broadcast_object(results)[self.env.rank]

    def _generate(self, prompts: list[list[int]], spec: SamplingSpec) -> list[RolloutSample]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(temperature=spec.temperature, top_p=spec.top_p,
                                max_tokens=spec.max_new_tokens, logprobs=0)
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params,
                                    use_tqdm=False)
        samples = []
        for prompt, output in zip(prompts, outputs, strict=True):
            completion = output.outputs[0]
            response = cut_at_eos(list(completion.token_ids), self.eos_token_id)
            logprobs = [position[token].logprob
                        for position, token in zip(completion.logprobs, response, strict=False)]
            samples.append(RolloutSample(prompt, response, torch.tensor(logprobs)))
        return samples

    def sync_weights(self) -> dict[str, float]:
        """Stream the trainer's current weights into the engine (every rank helps gather)."""
        stats = self.exporter.export(self.sink)
        return {"weight_sync_s": stats.seconds, "weight_sync_mb": stats.bytes_sent / 1e6}

    def close(self) -> None:
        """Stop the engine (its process too, when it has one); idempotent."""
        if self.llm is not None:
            shutdown_engine(self.llm)
        self.llm = self.sink = None
