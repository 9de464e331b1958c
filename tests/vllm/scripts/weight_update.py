"""Train one step, export into a running in-process vLLM engine, compare prompt log-probs.

usage: weight_update.py OUT_JSON PRESET [delta]

Writes the max |logp_vllm - logp_trainer| before and after the update, and how far vLLM moved.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from tempfile import TemporaryDirectory

import torch

from graft.config import compose
from graft.engine.batch.micro_batch import TokenSample
from graft.engine.distributed.env import shutdown_distributed
from graft.export import WeightExporter, hf_directory_sink
from graft.training.trainer import Trainer
from graft_vllm import DeltaTracker, VLLMSink, start_engine

PROMPT = [1, *range(10, 60)]


def vllm_prompt_logprobs(llm, ids: list[int]) -> torch.Tensor:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, prompt_logprobs=0)
    out = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)[0]
    return torch.tensor([d[t].logprob for d, t in zip(out.prompt_logprobs[1:], ids[1:], strict=True)])


def trainer_logprobs(trainer: Trainer) -> torch.Tensor:
    batches = trainer.engine.micro_batches([TokenSample(PROMPT, 1)])
    logprobs = trainer.engine.logprobs(batches, phase="old_logprobs")
    return batches[0].layout.unpad(logprobs[0])[0][:-1]


def main(out: str, preset: str, delta: bool) -> None:
    with TemporaryDirectory() as run:
        cfg = compose([f"trainer.run_dir={run}", "trainer.total_steps=1", f"model.preset={preset}",
                       "engine.device=cpu", "optim.lr=0.01", "checkpoint.every_steps=0",
                       "trainer.mode=sft",
                       "export.hf_at_end=false"])
        trainer = Trainer(cfg)
        model = trainer.engine.model
        tracker = DeltaTracker() if delta else None
        exporter = WeightExporter(model, bucket_bytes=64 << 10, dtype=None, is_main=True,
                                  entry_filter=tracker)
        # One export writes the engine's first weights and (delta) the exporter's baseline.
        initial = hf_directory_sink(model, Path(run) / "initial", dtype=None,
                                    tokenizer=trainer.tokenizer)
        exporter.export(initial)
        llm = start_engine(Path(run) / "initial", dtype="float32", max_model_len=256, seed=0)
        sink = VLLMSink(llm, initial.shapes, delta=delta,
                        current=tracker.snapshot if delta else None)
        before = vllm_prompt_logprobs(llm, PROMPT)
        before_error = float((before - trainer_logprobs(trainer)).abs().max())
        trainer.fit()
        stats = exporter.export(sink)
        after = vllm_prompt_logprobs(llm, PROMPT)
        result = {"before_error": before_error,
                  "after_error": float((after - trainer_logprobs(trainer)).abs().max()),
                  "moved": float((after - before).abs().max()), "buckets": stats.buckets,
                  "bytes_sent": stats.bytes_sent, "bytes_total": stats.bytes_total,
                  "seconds": stats.seconds}
        Path(out).write_text(json.dumps(result))
        del trainer, llm, sink, exporter


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], len(sys.argv) > 3 and sys.argv[3] == "delta")
    shutdown_distributed()
