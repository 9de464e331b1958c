"""SDPA backends for the graphed decode loop's attention
(`graft_graphed_decode.decode_attention`), at its shapes: one query per row, the 8 query heads
of each key/value head as one block, a boolean key mask, keys cut to the attended length. Per
backend, batch size and attended length: microseconds per call (the mean of ``--repeats`` calls
between CUDA events, one layer's worth) and how far its output is from a float64 reference next
to how far cuDNN's is.

TinyLlama-1.1B shapes (32 heads, 4 key/value heads, head dim 64), a 320-slot cache with random
left padding. Which backend SDPA picks by itself is the "default" row.

    python3 bench/gpu/decode_attention_backends.py --out $OUT/decode_attention_backends.json
    python3 bench/gpu/decode_attention_backends.py --device cpu --repeats 3   # smoke test
"""

from __future__ import annotations

import argparse
import json
import time
from contextlib import nullcontext

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

HEADS, KV_HEADS, HEAD_DIM, CACHE = 32, 4, 64, 320
BACKENDS = {"default": None, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}


def inputs(batch: int, attended: int, device: str, generator: torch.Generator) -> tuple:
    """Grouped queries, the cache's first ``attended`` keys and values, and their mask."""
    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(device, torch.bfloat16)

    query = normal(batch, KV_HEADS, HEADS // KV_HEADS, HEAD_DIM)
    keys, values = normal(batch, KV_HEADS, CACHE, HEAD_DIM), normal(batch, KV_HEADS, CACHE, HEAD_DIM)
    padding = torch.randint(0, 32, (batch, 1), generator=generator)
    slots = torch.arange(CACHE)[None, :]
    valid = (slots >= padding) & (slots < attended)
    mask = valid[:, None, None, :attended].to(device)
    return query, keys[:, :, :attended], values[:, :, :attended], mask


def attend(query, keys, values, mask, backend) -> torch.Tensor:
    context = sdpa_kernel(backend) if backend is not None else nullcontext()
    with context:
        return torch.nn.functional.scaled_dot_product_attention(query, keys, values,
                                                                attn_mask=mask)


def microseconds(tensors: tuple, backend, device: str, repeats: int) -> float:
    """Mean time of one `attend` call over ``repeats`` calls, after a few warm-up calls."""
    for _ in range(3):
        attend(*tensors, backend)
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            attend(*tensors, backend)
        end.record()
        torch.cuda.synchronize()
        return 1000 * start.elapsed_time(end) / repeats
    started = time.perf_counter()
    for _ in range(repeats):
        attend(*tensors, backend)
    return 1e6 * (time.perf_counter() - started) / repeats


def measure(batch: int, attended: int, args: argparse.Namespace,
            generator: torch.Generator) -> list[dict]:
    """One row per backend: its time, its error against float64, whether it equals cuDNN."""
    tensors = inputs(batch, attended, args.device, generator)
    query, keys, values, mask = tensors
    reference = attend(query.double(), keys.double(), values.double(), mask, SDPBackend.MATH)
    rows, outputs = [], {}
    for name, backend in BACKENDS.items():
        row = {"batch": batch, "attended": attended, "backend": name}
        try:
            outputs[name] = attend(*tensors, backend)
            row["us"] = round(microseconds(tensors, backend, args.device, args.repeats), 2)
        except RuntimeError as error:  # a backend that does not take these inputs
            row["error"] = str(error).splitlines()[0][:200]
        else:
            row["max_abs_error"] = float((outputs[name].double() - reference).abs().max())
        rows.append(row)
    for row in rows:
        if "us" in row and "cudnn" in outputs:
            row["equals_cudnn"] = bool(torch.equal(outputs[row["backend"]], outputs["cudnn"]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 32, 64, 128, 256])
    parser.add_argument("--attended", type=int, nargs="+", default=[64, 128, 192, 256, 320])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(0)
    rows = [row for batch in args.batches for attended in args.attended
            for row in measure(batch, attended, args, generator)]
    print(f"{'batch':>5} {'keys':>5} {'backend':>10} {'us':>9} {'max err':>9}")
    for row in rows:
        detail = (f"{row['us']:>9.2f} {row['max_abs_error']:>9.2g}" if "us" in row
                  else row["error"])
        print(f"{row['batch']:>5} {row['attended']:>5} {row['backend']:>10} {detail}")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
                       "device": args.device, "rows": rows}, handle, indent=2)


if __name__ == "__main__":
    main()
