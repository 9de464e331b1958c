"""Full weight export of a GPT-OSS-20B-shaped model: Graft's streamed exporter against the naive
path, into a device-side sink and into pinned host memory, in one run.

Model: GPT-OSS-20B shapes (hidden 2880, 32 experts with MLP 2880, 64 heads / 8 KV, vocab 201088),
``--layers`` of its 24 layers, random weights (bf16, or ``--master-dtype``; exported in
``--export-dtype``, GB/s count exported bytes), FSDP2 over the GPUs of the run (one, or
several under torchrun; rank 0 exports, every rank helps gather). Sinks take buckets without
copying them (as a CUDA-IPC or shared-memory hand-off to an inference engine would); the variant
"+ consumer copy" also copies every tensor into preallocated destination tensors.

Reference rates, measured in the same run: a device-to-device copy and a pinned device-to-host
copy of 4 GiB (payload bytes per second), on several ranks an all-gather of 4 GiB, and the
model's own tensors copied into one flat buffer without any export logic (one ``copy_`` each, and
one ``_foreach_copy_``). Naive baseline: ``get_model_state_dict(full_state_dict=True)`` (the
whole model gathered on every rank), then renamed to HF names, then handed over (or moved to
host).

    python3 bench/export.py --out $OUT/export.json           # all 24 layers, 41.8 GB
    torchrun --nproc-per-node 2 bench/export.py --out $OUT/export_2gpu.json   # FSDP2 over 2 GPUs
    python3 bench/export.py --layers 12 --master-dtype float32 --export-dtype bfloat16  # RL sync
    python3 bench/export.py --tiny                           # CPU smoke test
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from functools import partial

import torch
import torch.distributed as dist
import transformers
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from graft.config import compose
from graft.engine.distributed.env import init_distributed
from graft.engine.distributed.parallelize import parallelize
from graft.export.bucket import copy_tensors
from graft.export.gather import local_tensor
from graft.export.handlers import meta_skeleton
from graft.export.stream import WeightExporter, hf_tensors
from graft.models.build import build_model

GPT_OSS_20B = {"hidden_size": 2880, "intermediate_size": 2880, "num_local_experts": 32,
               "num_experts_per_tok": 4, "num_attention_heads": 64, "num_key_value_heads": 8,
               "head_dim": 64, "vocab_size": 201088, "sliding_window": 128}


class HandoffSink:
    """Takes each bucket without copying it; optionally copies into a destination (consumer)."""

    def __init__(self, destination: dict[str, torch.Tensor] | None = None) -> None:
        self.destination = destination
        self.bytes = 0

    def begin(self) -> None:
        self.bytes = 0

    def consume(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        if self.destination is not None:
            copy_tensors([self.destination[n] for n, _ in tensors], [t for _, t in tensors])
        self.bytes += sum(t.numel() * t.element_size() for _, t in tensors)

    def finish(self) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def abort(self, error: BaseException) -> None:
        pass


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def measure(make, repeats: int, budget_seconds: float = 10.0) -> tuple[float, float, int]:
    """Median seconds of the function ``make()`` returns, the peak GiB allocated on top of what
    was allocated before ``make`` (its buffers included), and how many runs were timed.

    After one warm-up it runs ``repeats`` times, fewer (at least one) where that would take more
    than ``budget_seconds``: the naive-to-host path (~30 s a run) would otherwise take minutes.
    """
    sync()
    base = torch.cuda.memory_allocated() if torch.cuda.is_available() else 0
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    fn = make()
    sync()
    started = time.perf_counter()
    fn()
    sync()
    warm_up = time.perf_counter() - started
    times = []
    for _ in range(agreed(max(1, min(repeats, int(budget_seconds / max(warm_up, 1e-6)))))):
        sync()
        started = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - started)
    peak = (torch.cuda.max_memory_allocated() - base) / 2**30 if torch.cuda.is_available() else 0.0
    return statistics.median(times), peak, len(times)


def agreed(count: int) -> int:
    """The smallest ``count`` over all ranks, so that every rank runs the same collectives."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return count
    value = torch.tensor([count], device="cuda" if torch.cuda.is_available() else "cpu")
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return int(value.item())


def copy_rates(device: torch.device, nbytes: int, repeats: int) -> dict[str, float]:
    """Reference rates: one large device-to-device and pinned device-to-host copy, and on
    several ranks an all-gather of the same size (GB/s of the gathered bytes)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    seconds, _, _ = measure(lambda: lambda: dst.copy_(src), repeats)
    rates = {"device_copy_gb_per_s": nbytes / seconds / 1e9}
    if device.type == "cuda":
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        seconds, _, _ = measure(lambda: lambda: host.copy_(src, non_blocking=True), repeats)
        rates["d2h_pinned_gb_per_s"] = nbytes / seconds / 1e9
    if dist.get_world_size() > 1:
        shard = src[:nbytes // dist.get_world_size()]
        seconds, _, _ = measure(lambda: lambda: dist.all_gather_into_tensor(dst, shard), repeats)
        rates["all_gather_gb_per_s"] = nbytes / seconds / 1e9
    return rates


def model_copy_rates(model: torch.nn.Module, repeats: int) -> dict[str, float]:
    """The model's own tensors (this rank's shards) copied into a flat buffer, no export logic:
    one ``copy_`` per tensor, and one multi-tensor ``_foreach_copy_`` (GB/s of copied bytes)."""
    sources = [local_tensor(p) for p in model.parameters()]
    flat = torch.empty(sum(s.numel() * s.element_size() for s in sources), dtype=torch.uint8,
                       device=sources[0].device)
    targets, start = [], 0
    for source in sources:
        nbytes = source.numel() * source.element_size()
        targets.append(flat[start:start + nbytes].view(source.dtype).view(source.shape))
        start += nbytes

    def one_by_one() -> None:
        for target, source in zip(targets, sources, strict=True):
            target.copy_(source, non_blocking=True)

    each, _, _ = measure(lambda: one_by_one, repeats)
    together, _, _ = measure(lambda: lambda: torch._foreach_copy_(targets, sources), repeats)
    return {"model_copy_each_gb_per_s": start / each / 1e9,
            "model_foreach_copy_gb_per_s": start / together / 1e9}


def naive_export(model: torch.nn.Module, skeleton: torch.nn.Module, sink: HandoffSink | None, *,
                 to_host: bool, dtype: torch.dtype | None) -> None:
    """The whole state dict gathered at once (on every rank), then renamed to HF layout (and cast
    to ``dtype``), then handed over by rank 0."""
    from transformers.core_model_loading import revert_weight_conversion

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    if sink is None:
        return
    renamed = revert_weight_conversion(skeleton, full)
    if dtype is not None:
        renamed = {k: v.to(dtype) for k, v in renamed.items()}
    if to_host:
        renamed = {k: v.to("cpu") for k, v in renamed.items()}
    sink.begin()
    sink.consume(list(renamed.items()))
    sink.finish()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--bucket-mb", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--master-dtype", default="bfloat16", choices=["bfloat16", "float32"],
                        help="dtype of the trained weights")
    parser.add_argument("--export-dtype", default=None, choices=["bfloat16", "float32"],
                        help="dtype the sink receives (default: the master dtype)")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device = torch.device("cpu" if args.tiny else "cuda")
    env = init_distributed(device_preference=device.type)
    shapes = {} if args.tiny else {**GPT_OSS_20B, "num_hidden_layers": args.layers}
    cfg = compose(["model.preset=tiny-gpt-oss", f"model.dtype={args.master_dtype}",
                   f"engine.device={device.type}",
                   *[f"+model.overrides.{k}={v}" for k, v in shapes.items()]])
    model, family = build_model(cfg.model, device=device)
    model = parallelize(model, family, cfg=cfg, mesh=env.mesh, device=device)
    skeleton = meta_skeleton(model)
    # model_bytes: what the sink receives (in the export dtype); all GB/s are of these bytes
    cast = None if args.export_dtype in (None, args.master_dtype) else getattr(torch, args.export_dtype)
    model_bytes = sum(p.numel() * (cast or p.dtype).itemsize for p in model.parameters())
    bucket = (args.bucket_mb if not args.tiny else 1) << 20
    result = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name() if
              device.type == "cuda" else "cpu", "torch": torch.__version__, "layers": args.layers,
              "transformers": transformers.__version__, "world_size": env.world_size,
              "master_dtype": args.master_dtype,
              "export_dtype": args.export_dtype or args.master_dtype,
              "model_gb": model_bytes / 1e9, "bucket_mb": bucket >> 20,
              "largest_tensor_gib": max(p.numel() * p.element_size() for p in model.parameters()) / 2**30,
              **copy_rates(device, 4 << 30 if device.type == "cuda" else 64 << 20, args.repeats),
              **model_copy_rates(model, args.repeats), "rows": []}

    def row(name: str, make) -> None:
        seconds, peak, timed = measure(make, args.repeats)
        entry = {"variant": name, "seconds": round(seconds, 4), "repeats": timed,
                 "gb_per_s": round(model_bytes / seconds / 1e9, 1), "peak_extra_gib": round(peak, 2)}
        result["rows"].append(entry)
        if env.is_main:
            print(json.dumps(entry), flush=True)

    def exporter(bucket_device: torch.device) -> WeightExporter:
        return WeightExporter(model, bucket_bytes=bucket, dtype=cast,
                              is_main=env.is_main, bucket_device=bucket_device)

    def with_consumer():
        destination = {n: torch.empty_like(t) for n, t in
                       hf_tensors(model, dtype=cast, is_main=env.is_main)}
        return partial(exporter(device).export, HandoffSink(destination) if env.is_main else None)

    sink = HandoffSink() if env.is_main else None
    row("graft -> device sink", lambda: partial(exporter(device).export, sink))
    row("graft -> device sink + consumer copy", with_consumer)
    row("graft -> pinned host", lambda: partial(exporter(torch.device("cpu")).export, sink))
    naive = partial(naive_export, model, skeleton, sink, dtype=cast)
    row("naive -> device sink", lambda: partial(naive, to_host=False))
    row("naive -> host", lambda: partial(naive, to_host=True))
    if env.is_main:
        report(result, args.out)


def report(result: dict, out: str | None) -> None:
    """Print the table and write the JSON."""
    d2h, gather = result.get("d2h_pinned_gb_per_s"), result.get("all_gather_gb_per_s")
    print(f"model {result['model_gb']:.1f} GB, bucket {result['bucket_mb']} MiB, largest tensor "
          f"{result['largest_tensor_gib']:.2f} GiB; device copy "
          f"{result['device_copy_gb_per_s']:.0f} GB/s" + (f", pinned D2H {d2h:.1f} GB/s" if d2h else "")
          + f"; model tensors copied one by one {result['model_copy_each_gb_per_s']:.0f} GB/s, "
          f"with _foreach_copy_ {result['model_foreach_copy_gb_per_s']:.0f} GB/s"
          + (f"; all-gather over {result['world_size']} ranks {gather:.0f} GB/s" if gather else ""))
    print(f"{'variant':<40} {'GB/s':>8} {'s':>8} {'peak extra GiB':>15}")
    for r in result["rows"]:
        print(f"{r['variant']:<40} {r['gb_per_s']:>8} {r['seconds']:>8} {r['peak_extra_gib']:>15}")
    if out:
        with open(out, "w") as handle:
            json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()
