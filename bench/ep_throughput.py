"""Expert parallelism for GPT-OSS (graft-gpt-oss) on the ranks of one run: SFT step throughput and
weight export at every ep size, side by side.

Run under torchrun, one process per GPU (or per CPU rank with ``--small``). For each ep size in
{1, 2, world} that divides the world and the experts (``--ep-sizes`` to choose):

* SFT step (forward, backward, AdamW; ``--warmup`` then the mean of ``--steps``) of a GPT-OSS-20B
  -shaped model (`gpt_oss.shapes_for`: 32 experts top-4, hidden 2880, ``--layers`` layers), fp32
  masters, bf16 compute, flex attention, one ``--tokens`` sequence per GPU (each rank its own
  data). EP = 1: experts FSDP2-sharded over all ranks (transformers' grouped_mm experts); EP > 1:
  experts split over ``ep`` ranks, all-to-all dispatch and combine, grouped GEMMs on the local
  experts, each block FSDP2-sharded over ``world / ep``. Tokens/s (all ranks and per GPU), model
  TFLOP/s per GPU (active parameters, `gpt_oss.model_flops`), peak memory (max over ranks), and
  the share of the step spent in all-to-all (the profiler's NCCL SendRecv kernels on GPU, gloo
  all-to-all on CPU; one profiled step).
* Full export of the trained weights in bf16, streamed to rank 0: in vLLM's layout (one tensor
  per expert; expert blocks arrive one ep rank at a time) into a device sink and into pinned host,
  and in transformers' fused layout (row blocks) into a device sink. GB/s of exported bytes at the
  receiving GPU against a device copy, a pinned device-to-host copy, an all-gather and a
  point-to-point send of the same size measured in the same run; peak extra device memory on
  rank 0 against its bound: one bucket plus the larger of one expert block and the largest
  non-expert tensor (gathered whole).

    torchrun --nproc-per-node 2 bench/ep_throughput.py --out $OUT/ep_throughput_2gpu.json   # ~3 min
    python3 bench/ep_throughput.py --layers 2 --out $OUT/ep_throughput_1gpu.json            # 1 GPU
    torchrun --nproc-per-node 2 bench/ep_throughput.py --small        # CPU ranks (gloo), seconds
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
import export as export_bench  # noqa: E402  (bench/export.py: rates, timing, hand-off sink)
import gpt_oss  # noqa: E402  (bench/gpt_oss.py: shapes, the Graft engine, FLOPs)
import timing  # noqa: E402

# Profiler events of the all-to-all: NCCL's kernel on GPU; on CPU the gloo calls and the waits
# on their results (functional collectives, which only the expert dispatch uses here).
ALL_TO_ALL_EVENTS = {"cuda": ("sendrecv",), "cpu": ("alltoall", "all_to_all", "wait_tensor")}


class RowHandoffSink(export_bench.HandoffSink):
    """The hand-off sink, also taking row blocks of fused tensors without copying them."""

    def consume_rows(self, blocks: list[Any]) -> None:
        self.bytes += sum(block.nbytes for block in blocks)


def ep_sizes(world: int, num_experts: int, requested: str | None) -> list[int]:
    """The ep sizes to run: ``requested`` (comma list) or {1, 2, world}, those dividing both."""
    sizes = [int(s) for s in requested.split(",")] if requested else sorted({1, 2, world})
    return [ep for ep in sizes if world % ep == 0 and num_experts % ep == 0]


def max_over_ranks(value: float, device: torch.device) -> float:
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return float(tensor.item())


def all_to_all_share(step, device: torch.device, step_s: float) -> float:
    """Share of one step spent in all-to-all, from a profiled step: NCCL SendRecv kernel time
    on GPU, gloo all-to-all calls and their waits on CPU, over the step's mean time ``step_s``."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CUDA] if device.type == "cuda" else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        step()
        timing.sync(device)
    total_us = 0.0
    markers = ALL_TO_ALL_EVENTS[device.type]
    for event in prof.key_averages():
        if any(marker in event.key.lower() for marker in markers):
            total_us += (event.self_device_time_total if device.type == "cuda"
                         else event.self_cpu_time_total)
    return total_us / 1e6 / step_s


def p2p_rate(device: torch.device, nbytes: int, repeats: int) -> float:
    """Point-to-point send from the last rank to rank 0 (GB/s of payload): how expert blocks
    reach the exporting rank."""
    rank, last = dist.get_rank(), dist.get_world_size() - 1
    buffer = torch.empty(nbytes, dtype=torch.uint8, device=device)

    def transfer() -> None:
        if rank == last:
            dist.send(buffer, dst=0)
        elif rank == 0:
            dist.recv(buffer, src=last)

    seconds, _, _ = export_bench.measure(lambda: transfer, repeats)
    return nbytes / seconds / 1e9


def step_row(ep: int, shapes: dict[str, Any], tokens: int, args, device) -> tuple[dict, Any]:
    """Build Graft's engine at ``ep``, time its steps, profile one; the row and the model."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    model, step = gpt_oss.graft_engine(shapes, tokens, device, args.attn, ep=ep)
    seconds = timing.timed(step, warmup=args.warmup, steps=args.steps, device=device)
    seconds = max_over_ranks(seconds, device)
    share = max_over_ranks(all_to_all_share(step, device, seconds), device) if ep > 1 else 0.0
    world = dist.get_world_size()
    n_active = gpt_oss.active_params(model, model.config)  # DTensor numel: the whole model's
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
    row = {"world_size": world, "ep_size": ep, "step_s": round(seconds, 4),
           "tokens_per_s": round(world * tokens / seconds),
           "tokens_per_s_per_gpu": round(tokens / seconds),
           "model_tflops_per_gpu": round(gpt_oss.model_flops(n_active, model.config, tokens)
                                         / seconds / 1e12, 1),
           "all_to_all_share": round(share, 3),
           "peak_gib": round(max_over_ranks(peak, device), 1)}
    if dist.get_rank() == 0:
        print(json.dumps(row), flush=True)
    del step
    return row, model


def export_bound_bytes(model: torch.nn.Module, bucket: int, ep: int) -> int:
    """One bucket plus the larger of one expert block and the largest non-expert tensor (bf16)."""
    block, whole = 0, 0
    for name, param in model.named_parameters():
        if ".mlp.experts." in name:
            block = max(block, param.numel() // ep * 2)
        else:
            whole = max(whole, param.numel() * 2)
    return bucket + max(block, whole)


def export_rows_for(model: torch.nn.Module, ep: int, device: torch.device, args) -> list[dict]:
    """Full bf16 exports streamed to rank 0 (every rank helps): per expert to a device sink and
    to pinned host, fused (row blocks) to a device sink."""
    from graft.export.stream import WeightExporter

    is_main = dist.get_rank() == 0
    bucket = (1 if args.small else args.bucket_mb) << 20
    model_bytes = sum(p.numel() for p in model.parameters()) * 2
    variants = [("per expert", gpt_oss.PerExpertSink, "device sink", device),
                ("fused rows", RowHandoffSink, "device sink", device)]
    if device.type == "cuda":
        variants.insert(1, ("per expert", gpt_oss.PerExpertSink, "pinned host",
                            torch.device("cpu")))
    rows = []
    for layout, sink_class, target, bucket_device in variants:
        exporter = WeightExporter(model, bucket_bytes=bucket, dtype=torch.bfloat16,
                                  is_main=is_main, bucket_device=bucket_device)
        sink = sink_class() if is_main else None
        seconds, peak, repeats = export_bench.measure(
            lambda exporter=exporter, sink=sink: partial(exporter.export, sink), args.repeats)
        row = {"world_size": dist.get_world_size(), "ep_size": ep, "layout": layout,
               "target": target, "seconds": round(seconds, 4), "repeats": repeats,
               "gb_per_s": round(model_bytes / seconds / 1e9, 1),
               "peak_extra_gib": round(peak, 2),
               "bound_gib": round(export_bound_bytes(model, bucket, ep) / 2**30, 2)}
        if is_main:
            print(json.dumps(row), flush=True)
        rows.append(row)
        del exporter, sink
        timing.release(device)
    return rows


def report(result: dict, out: str | None) -> None:
    """Print the tables and write the JSON."""
    print(f"{'ranks':>5} {'ep':>3} {'tokens/s':>9} {'/GPU':>7} {'TFLOP/s/GPU':>11} "
          f"{'a2a share':>9} {'step s':>7} {'peak GiB':>8}")
    for r in result["steps"]:
        print(f"{r['world_size']:>5} {r['ep_size']:>3} {r['tokens_per_s']:>9} "
              f"{r['tokens_per_s_per_gpu']:>7} {r['model_tflops_per_gpu']:>11} "
              f"{r['all_to_all_share']:>9.1%} {r['step_s']:>7} {r['peak_gib']:>8}")
    rates = result["rates"]
    print("reference rates (GB/s): " + ", ".join(f"{k.removesuffix('_gb_per_s')} {v:.0f}"
                                                 for k, v in rates.items()))
    print(f"{'ep':>3} {'export':<30} {'GB/s':>8} {'s':>8} {'peak GiB':>9} {'bound GiB':>9}")
    for r in result["exports"]:
        print(f"{r['ep_size']:>3} {r['layout'] + ' -> ' + r['target']:<30} {r['gb_per_s']:>8} "
              f"{r['seconds']:>8} {r['peak_extra_gib']:>9} {r['bound_gib']:>9}")
    if out:
        Path(out).write_text(json.dumps(result, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny shapes on CPU ranks (gloo)")
    parser.add_argument("--layers", type=int, default=None, help="default 8 (2 with --small)")
    parser.add_argument("--tokens", type=int, default=None,
                        help="tokens per GPU and step; default 8192 (128 with --small)")
    parser.add_argument("--ep-sizes", default=None, help="comma list; default 1,2,world")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5, help="timed exports per variant")
    parser.add_argument("--bucket-mb", type=int, default=2048)
    parser.add_argument("--attn", default="flex_attention",
                        help="attention backend on GPU (eager also has sinks; CPU: eager)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    args.layers = args.layers or (2 if args.small else 8)
    args.attn = None if args.small else args.attn
    tokens = args.tokens or (128 if args.small else 8192)
    device = torch.device("cpu" if args.small else "cuda")
    import transformers

    from graft.engine.distributed.env import init_distributed

    env = init_distributed(device_preference=device.type)
    shapes = gpt_oss.shapes_for(args)
    rate_bytes = (1 << 30) if device.type == "cuda" else (16 << 20)
    rates = export_bench.copy_rates(device, rate_bytes, args.repeats)
    if env.world_size > 1:
        rates["p2p_gb_per_s"] = p2p_rate(device, rate_bytes, args.repeats)
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "world_size": env.world_size, "tokens_per_gpu": tokens, "shapes": shapes,
        "rates": rates, "steps": [], "exports": []}
    for ep in ep_sizes(env.world_size, shapes["num_local_experts"], args.ep_sizes):
        row, model = step_row(ep, shapes, tokens, args, device)
        result["steps"].append(row)
        result["exports"] += export_rows_for(model, ep, device, args)
        del model
        timing.release(device)
    if env.is_main:
        report(result, args.out)


if __name__ == "__main__":
    main()
