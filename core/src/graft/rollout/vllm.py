"""The vLLM rollout engine: an in-process vLLM whose weights follow the trainer.

At start the trainer's weights are exported to ``<run_dir>/rollout_init`` (a HF directory) and
vLLM starts from it; after every update `sync_weights` streams the new weights into the engine
(`graft.export.sinks.vllm.VLLMSink`, delta rows with ``export.delta``). vLLM runs inside the
trainer's process, so this engine needs a single-process trainer.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from graft.errors import ConfigError
from graft.export.hf import export_model_to_hf
from graft.export.sinks.vllm import VLLMSink, safetensors_shapes
from graft.export.stream import WeightExporter, default_bucket_bytes
from graft.inference.vllm_engine import start_engine
from graft.rollout.types import RolloutSample, SamplingSpec, cut_at_eos


class VLLMRollout:
    """Generates with vLLM; `sync_weights` pushes the trainer's weights into it."""

    name = "vllm"

    def __init__(self, model: torch.nn.Module, *, cfg: Any, world_size: int, run_dir: Path,
                 tokenizer: Any, eos_token_id: int) -> None:
        if world_size > 1:
            raise ConfigError("rollout.engine=vllm runs vLLM inside the trainer's process and "
                              "needs a single-process trainer; drop --nproc (or use "
                              "rollout.engine=embedded for several ranks)")
        device = next(model.parameters()).device
        # vLLM computes in the trainer's compute dtype, so log-probs agree to rounding.
        dtype_name = "bfloat16" if device.type == "cuda" else "float32"
        dtype = getattr(torch, dtype_name)
        init_dir = run_dir / "rollout_init"
        export_model_to_hf(model, init_dir, tokenizer=tokenizer, is_main=True,
                           export_cfg=dataclasses.replace(cfg.export, dtype=dtype_name))
        self.llm = start_engine(init_dir, dtype=dtype_name, seed=cfg.trainer.seed,
                                max_model_len=cfg.rollout.max_model_len,
                                gpu_memory_utilization=cfg.rollout.gpu_memory_utilization)
        self.sink = VLLMSink(self.llm, safetensors_shapes(init_dir))
        self.exporter = WeightExporter(
            model, bucket_bytes=default_bucket_bytes(cfg.export.bucket_mb, device), dtype=dtype,
            delta=cfg.export.delta, is_main=True)
        if cfg.export.delta:
            self.exporter.export(self.sink)  # the delta baseline: what the engine holds now
        self.eos_token_id = eos_token_id

    def generate(self, prompts: list[list[int]], spec: SamplingSpec) -> list[RolloutSample]:
        """One sample per prompt, with the sampled tokens' log-probabilities."""
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
        """Stream the trainer's current weights into the engine."""
        stats = self.exporter.export(self.sink)
        return {"weight_sync_s": stats.seconds, "weight_sync_mb": stats.bytes_sent / 1e6}

    def close(self) -> None:
        """Drop the engine."""
        self.llm = None
