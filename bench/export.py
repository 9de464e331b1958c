"""Full weight export of a GPT-OSS-20B-shaped model on one GPU: Graft's streamed exporter against the
naive path, into a device-side sink and into pinned host memory, in one run.

Model: GPT-OSS-20B shapes (hidden 2880, 32 experts with MLP 2880, 64 heads / 8 KV, vocab 201088),
``--layers`` of its 24 layers, random bf16 weights, FSDP2 on one GPU. Sinks take buckets without
copying them (as a CUDA-IPC or shared-memory hand-off to an inference engine would); the variant
"+ consumer copy" also copies every tensor into preallocated destination tensors.

Reference rates, measured in the same run: a device-to-device copy and a pinned device-to-host
copy of 4 GiB (payload bytes per second). Naive baseline: ``get_model_state_dict(full_state_dict=
True)`` (the whole model gathered), then renamed to HF names, then handed over (or moved to host).

    python3 bench/export.py --layers 12 --out $OUT/export.json
    python3 bench/export.py --tiny                      # CPU smoke test
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from functools import partial

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from graft.config import compose
from graft.engine.distributed import init_distributed
from graft.engine.parallelize import parallelize
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
            torch._foreach_copy_([self.destination[n] for n, _ in tensors], [t for _, t in tensors])
        self.bytes += sum(t.numel() * t.element_size() for _, t in tensors)

    def finish(self) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def abort(self, error: BaseException) -> None:
        pass


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def measure(make, repeats: int) -> tuple[float, float]:
    """Median seconds of the function ``make()`` returns (after one warm-up), and the peak GiB
    allocated on top of what was allocated before ``make`` (its buffers included)."""
    sync()
    base = torch.cuda.memory_allocated() if torch.cuda.is_available() else 0
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    fn = make()
    fn()
    times = []
    for _ in range(repeats):
        sync()
        started = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - started)
    peak = (torch.cuda.max_memory_allocated() - base) / 2**30 if torch.cuda.is_available() else 0.0
    return statistics.median(times), peak


def copy_rates(device: torch.device, nbytes: int) -> dict[str, float]:
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    seconds, _ = measure(lambda: lambda: dst.copy_(src), 5)
    rates = {"device_copy_gb_per_s": nbytes / seconds / 1e9}
    if device.type == "cuda":
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        seconds, _ = measure(lambda: lambda: host.copy_(src, non_blocking=True), 5)
        rates["d2h_pinned_gb_per_s"] = nbytes / seconds / 1e9
    return rates


def naive_export(model: torch.nn.Module, skeleton: torch.nn.Module, sink: HandoffSink, *,
                 to_host: bool) -> None:
    """The whole state dict gathered at once, then renamed to HF layout, then handed over."""
    from transformers.core_model_loading import revert_weight_conversion

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    renamed = revert_weight_conversion(skeleton, full)
    if to_host:
        renamed = {k: v.to("cpu") for k, v in renamed.items()}
    sink.begin()
    sink.consume(list(renamed.items()))
    sink.finish()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--bucket-mb", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device = torch.device("cpu" if args.tiny else "cuda")
    env = init_distributed(device_preference=device.type)
    shapes = {} if args.tiny else {**GPT_OSS_20B, "num_hidden_layers": args.layers}
    cfg = compose(["model.preset=tiny-gpt-oss", "model.dtype=bfloat16", f"engine.device={device.type}",
                   *[f"+model.overrides.{k}={v}" for k, v in shapes.items()]])
    model, family = build_model(cfg.model, device=device)
    model = parallelize(model, family, cfg=cfg, mesh=env.mesh, device=device)
    skeleton = meta_skeleton(model)
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    bucket = (args.bucket_mb if not args.tiny else 1) << 20
    result = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name() if
              device.type == "cuda" else "cpu", "torch": torch.__version__, "layers": args.layers,
              "model_gb": model_bytes / 1e9, "bucket_mb": bucket >> 20,
              "largest_tensor_gib": max(p.numel() * p.element_size() for p in model.parameters()) / 2**30,
              **copy_rates(device, 4 << 30 if device.type == "cuda" else 64 << 20), "rows": []}

    def row(name: str, make) -> None:
        seconds, peak = measure(make, args.repeats)
        entry = {"variant": name, "seconds": round(seconds, 4),
                 "gb_per_s": round(model_bytes / seconds / 1e9, 1), "peak_extra_gib": round(peak, 2)}
        result["rows"].append(entry)
        print(json.dumps(entry), flush=True)

    def exporter(bucket_device: torch.device) -> WeightExporter:
        return WeightExporter(model, bucket_bytes=bucket, dtype=None, delta=False, is_main=True,
                              bucket_device=bucket_device)

    def with_consumer():
        destination = {n: torch.empty_like(t) for n, t in hf_tensors(model, dtype=None)}
        return partial(exporter(device).export, HandoffSink(destination))

    sink = HandoffSink()
    row("graft -> device sink", lambda: partial(exporter(device).export, sink))
    row("graft -> device sink + consumer copy", with_consumer)
    row("graft -> pinned host", lambda: partial(exporter(torch.device("cpu")).export, sink))
    row("naive -> device sink", lambda: partial(naive_export, model, skeleton, sink, to_host=False))
    row("naive -> host", lambda: partial(naive_export, model, skeleton, sink, to_host=True))
    d2h = result.get("d2h_pinned_gb_per_s")
    print(f"model {result['model_gb']:.1f} GB, bucket {result['bucket_mb']} MiB, largest tensor "
          f"{result['largest_tensor_gib']:.2f} GiB; device copy "
          f"{result['device_copy_gb_per_s']:.0f} GB/s" + (f", pinned D2H {d2h:.1f} GB/s" if d2h else ""))
    print(f"{'variant':<40} {'GB/s':>8} {'s':>8} {'peak extra GiB':>15}")
    for r in result["rows"]:
        print(f"{r['variant']:<40} {r['gb_per_s']:>8} {r['seconds']:>8} {r['peak_extra_gib']:>15}")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()
