"""GPT-OSS with engine.ep_size=1 and 2 on the same ranks: 3 SFT steps on the same data, then the
exports of the EP=2 model. Run under ``torchrun --nproc-per-node 2`` (gloo, fp32):

    ep_equivalence.py OUT_DIR

Rank 0 saves ``OUT_DIR/result.pt``: per ep size the losses and, per step, every parameter's
whole gradient; the EP=1 model's exports in both layouts (HF layout, vLLM layout) from one
exporter; the EP=2 model's whole parameters, its exports into state-dict sinks, and a delta
export after a sparse update (both layouts; graft-vllm's `graft_vllm.delta`) with a full export to
compare it with.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from graft.config import compose
from graft.engine.batch.micro_batch import TokenSample
from graft.engine.distributed.env import end_torchrun_worker, init_distributed, shutdown_distributed
from graft.engine.phase import SFT
from graft.export import INFERENCE_LAYOUT
from graft.export.gather import local_tensor
from graft.export.stream import WeightExporter
from graft.training.sft import sft_loss
from graft.training.trainer import build_engine
from graft_vllm.delta import DeltaTracker, StateDictDeltaSink

STEPS = 3
BUCKET = 16 << 10  # small: several buckets, expert blocks split across them


class VLLMLayoutSink(StateDictDeltaSink):
    """A state dict in vLLM's loader layout (per-expert GPT-OSS tensors)."""

    consumer = INFERENCE_LAYOUT


def samples(rank: int, step: int) -> list[TokenSample]:
    generator = torch.Generator().manual_seed(100 * step + rank)
    return [TokenSample([1, *torch.randint(3, 100, (int(n),), generator=generator).tolist()], 4)
            for n in torch.randint(12, 40, (4,), generator=generator)]


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's whole value (a collective), or the tensor."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def train(ep: int, rank: int) -> tuple[object, dict]:
    cfg = compose(["model.preset=tiny-gpt-oss", "engine.device=cpu", "trainer.mode=sft",
                   f"engine.ep_size={ep}", "optim.lr=1e-3"])
    env = init_distributed(device_preference="cpu", ep_size=ep)
    engine = build_engine(cfg, env, pad_token_id=0)
    losses, grads = [], []
    for step in range(STEPS):
        pending = engine.forward_backward(engine.micro_batches(samples(rank, step)), sft_loss,
                                          loss_scale_factor=1.0, phase=SFT)
        grads.append({n: whole(p.grad).clone() for n, p in engine.model.named_parameters()})
        engine.optimizer_step()
        losses.append(pending.result().loss)
    return engine, {"losses": losses, "grads": grads}


def full_exports(model: torch.nn.Module, is_main: bool, bucket: int = BUCKET) -> dict:
    """One exporter's full exports in both layouts (rank 0's sink decides, the others follow),
    and whether the HF one was planned (copies only)."""
    exporter = WeightExporter(model, bucket_bytes=bucket, dtype=None, is_main=is_main)
    out = {"planned": exporter.copy_plan is not None}
    for label, sink_class in (("hf", StateDictDeltaSink), ("vllm", VLLMLayoutSink)):
        sink = sink_class() if is_main else None
        exporter.export(sink)
        out[label] = sink.weights if is_main else None
    return out


def exports(model: torch.nn.Module, is_main: bool) -> dict:
    """Full exports in both layouts, then delta exports after a sparse update."""
    out = full_exports(model, is_main)
    delta = {label: (WeightExporter(model, bucket_bytes=BUCKET, dtype=None, is_main=is_main,
                                    entry_filter=DeltaTracker()), sink_class() if is_main else None)
             for label, sink_class in (("hf", StateDictDeltaSink), ("vllm", VLLMLayoutSink))}
    for exporter, sink in delta.values():
        exporter.export(sink)
    with torch.no_grad():  # a sparse update: one expert of each rank's block, three vocab rows
        local_tensor(model.model.layers[1].mlp.experts.down_proj)[1] += 0.25
        local_tensor(model.model.layers[0].mlp.experts.gate_up_proj_bias)[0] -= 0.5
        if torch.distributed.get_rank() == 0:
            local_tensor(model.model.embed_tokens.weight)[[5, 17]] += 0.5
    for label, (exporter, sink) in delta.items():
        stats = exporter.export(sink)
        out[f"delta_{label}"] = sink.weights if is_main else None
        out[f"delta_{label}_bytes"] = (stats.bytes_sent, stats.bytes_total)
        reference_class = StateDictDeltaSink if label == "hf" else VLLMLayoutSink
        reference = reference_class() if is_main else None
        WeightExporter(model, bucket_bytes=BUCKET, dtype=None, is_main=is_main).export(reference)
        out[f"after_{label}"] = reference.weights if is_main else None
    return out


def main(out_dir: str) -> None:
    init_distributed(device_preference="cpu")
    rank = torch.distributed.get_rank()
    result = {}
    engine, result[1] = train(1, rank)
    result["ep1_exports"] = full_exports(engine.model, is_main=rank == 0, bucket=4 << 20)
    engine, result[2] = train(2, rank)
    model = engine.model  # the EP=2 model
    result["params"] = {n: whole(p).detach().clone() for n, p in model.state_dict().items()}
    result["exports"] = exports(model, is_main=rank == 0)
    if rank == 0:
        torch.save(result, Path(out_dir) / "result.pt")


if __name__ == "__main__":
    main(sys.argv[1])
    shutdown_distributed()
    end_torchrun_worker()
