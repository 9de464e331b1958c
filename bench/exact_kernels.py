"""Each graft-exact kernel (``features.exact.enabled``) against the default kernel it replaces, at
a 1.1B model's decode and training shapes (TinyLlama: hidden 2048, MLP 5632, 32 heads of 64, 4
key/value heads, vocabulary 32000), bf16 on one GPU: the time of each (on the GPU as a CUDA
graph replays it, as the decode loop pays it), their ratio, and whether each one's rows are
bit-identical between a small and a large batch (the exact ones must be; the default ones
usually are not).

- matmul: ``exact_mm`` (Triton, one tile configuration, ``K`` in fixed chunks) vs ``torch.mm``
  (cuBLAS), M = the decode batch (8, 32, 256) and the training micro-batch (2048, 16384 tokens),
  for each layer's (K, N); each layout's time (``whole``: a program per tile; ``split``: a
  program per tile and chunk, up to 2048 rows) and whether the two give the same bits;
- rmsnorm: the exact RMSNorm (one Triton program per row) vs transformers' eager formula with
  the default kernels, and the eager formula inside the exact mode (about ten kernels);
- silu: the exact SiLU (one Triton kernel) vs ``F.silu``;
- logsumexp: the log-prob's normaliser over the vocabulary, ``exact_logsumexp`` vs ``torch``;
- attention: ``invariant_attention`` vs SDPA, a decode step (256 rows, one query over a
  512-slot cache) and a packed training row (2048 tokens, 8 samples of 256, boolean
  block-diagonal mask as transformers builds it).

    python3 bench/exact_kernels.py --out $OUT/exact_kernels.json
    python3 bench/exact_kernels.py --tiny            # CPU smoke test (the CPU exact kernels)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from statistics import median
from typing import Any

import torch
import torch.nn.functional as F
from graft_exact import exact_kernels
from graft_exact.attention import exact_attention_forward
from graft_exact.matmul import exact_mm
from graft_exact.norm import _ExactRMSNorm, eager_rms_norm
from graft_exact.reductions import exact_logsumexp, exact_silu
from timing import graph_ms

HIDDEN, MLP, VOCAB, HEADS, KV_HEADS, HEAD_DIM = 2048, 5632, 32000, 32, 4, 64
LINEARS = {"q/o": (HIDDEN, HIDDEN), "k/v": (HIDDEN, KV_HEADS * HEAD_DIM),
           "gate/up": (HIDDEN, MLP), "down": (MLP, HIDDEN), "head": (HIDDEN, VOCAB)}


def timed(fn: Callable[[], Any], device: torch.device, repeats: int) -> float:
    """Milliseconds per call of ``fn``: replayed from a CUDA graph on the GPU, the median of
    ``repeats`` calls (after two warm-up calls) on the CPU."""
    if device.type == "cuda":
        return graph_ms(fn, replays=repeats)
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - started) * 1e3)
    return median(times)


def rows_invariant(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> bool:
    """Whether ``fn``'s first rows are the same bits for the first 1, 7 and all rows of ``x``."""
    whole = fn(x)
    return all(torch.equal(fn(x[:count]), whole[:count]) for count in (1, 7))


def row(kind: str, shape: str, exact_ms: float, default_ms: float, exact_ok: bool,
        default_ok: bool, **extra: Any) -> dict[str, Any]:
    return {"kernel": kind, "shape": shape, "exact_ms": round(exact_ms, 4),
            "default_ms": round(default_ms, 4), "exact_over_default": round(exact_ms / default_ms, 3),
            "exact_rows_invariant": exact_ok, "default_rows_invariant": default_ok,
            **{k: round(v, 4) if isinstance(v, float) else v for k, v in extra.items()}}


def layouts(x: torch.Tensor, weight: torch.Tensor, device: torch.device,
            repeats: int) -> dict[str, Any]:
    """On the GPU: each layout's time and whether they give the same bits."""
    if device.type != "cuda":
        return {}
    from graft_exact.triton_matmul import invariant_mm

    whole = invariant_mm(x, weight, split=False)
    times = {"whole_ms": timed(lambda: invariant_mm(x, weight, split=False), device, repeats)}
    if x.shape[0] <= 2048:
        times["split_ms"] = timed(lambda: invariant_mm(x, weight, split=True), device, repeats)
        times["layouts_equal"] = torch.equal(invariant_mm(x, weight, split=True), whole)
    return times


def matmul_rows(device, dtype, batches, linears, repeats) -> list[dict[str, Any]]:
    out = []
    for name, (inner, outer) in linears.items():
        weight = torch.randn(outer, inner, device=device, dtype=dtype) / inner ** 0.5
        for m in batches:
            x = torch.randn(m, inner, device=device, dtype=dtype)
            out.append(row("matmul", f"{name} M={m} K={inner} N={outer}",
                           timed(lambda: exact_mm(x, weight.t()), device, repeats),
                           timed(lambda: torch.mm(x, weight.t()), device, repeats),
                           rows_invariant(lambda t: exact_mm(t, weight.t()), x),
                           rows_invariant(lambda t: torch.mm(t, weight.t()), x),
                           **layouts(x, weight.t(), device, repeats)))
            print(json.dumps(out[-1]), flush=True)
    return out


def eager_exact_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """transformers' RMSNorm formula inside the exact mode (its CPU path)."""
    with exact_kernels():
        return eager_rms_norm(x, weight, 1e-5)


def exact_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The RMSNorm as the exact model runs it on ``x``'s device (one kernel on CUDA)."""
    return _ExactRMSNorm.apply(x, weight, 1e-5) if x.is_cuda else eager_exact_norm(x, weight)


def elementwise_rows(device, dtype, batches, hidden, mlp, repeats) -> list[dict[str, Any]]:
    out = []
    weight = (1 + 0.1 * torch.randn(hidden, device=device)).to(dtype)
    for m in batches:
        x = torch.randn(m, hidden, device=device, dtype=dtype)
        out.append(row("rmsnorm", f"M={m} hidden={hidden}",
                       timed(lambda: exact_norm(x, weight), device, repeats),
                       timed(lambda: eager_rms_norm(x, weight, 1e-5), device, repeats),
                       rows_invariant(lambda t: exact_norm(t, weight), x),
                       rows_invariant(lambda t: eager_rms_norm(t, weight, 1e-5), x),
                       exact_eager_chain_ms=timed(lambda: eager_exact_norm(x, weight), device,
                                                  repeats)))
        gate = torch.randn(m, mlp, device=device, dtype=dtype)
        out.append(row("silu", f"M={m} width={mlp}",
                       timed(lambda: exact_silu(gate), device, repeats),
                       timed(lambda: F.silu(gate), device, repeats),
                       rows_invariant(exact_silu, gate), rows_invariant(F.silu, gate)))
    return out


def reduction_rows(device, dtype, batches, hidden, vocab, repeats) -> list[dict[str, Any]]:
    out = []
    for m in batches:
        logits = torch.randn(m, vocab, device=device, dtype=dtype).float()
        out.append(row("logsumexp", f"M={m} vocab={vocab}",
                       timed(lambda: exact_logsumexp(logits, -1), device, repeats),
                       timed(lambda: torch.logsumexp(logits, -1), device, repeats),
                       rows_invariant(lambda t: exact_logsumexp(t, -1), logits),
                       rows_invariant(lambda t: torch.logsumexp(t, -1), logits)))
    return out


def attention_rows(device, dtype, shapes, repeats) -> list[dict[str, Any]]:
    heads, kv_heads, dim = shapes["heads"], shapes["kv_heads"], shapes["dim"]
    module = torch.nn.Module()
    out = []
    # decode: one query per row over a cache, the first `filled` slots valid (left pad 0)
    batch, cache, filled = shapes["decode_batch"], shapes["cache"], shapes["filled"]
    q = torch.randn(batch, heads, 1, dim, device=device, dtype=dtype)
    k = torch.randn(batch, kv_heads, cache, dim, device=device, dtype=dtype)
    v = torch.randn_like(k)
    mask = (torch.arange(cache, device=device) < filled)[None, None, None].expand(batch, 1, 1,
                                                                                  cache)
    def exact_decode(q=q, k=k, v=v, mask=mask):
        return exact_attention_forward(module, q, k, v, mask, scaling=dim ** -0.5)[0]

    def default_decode(q=q, k=k, v=v, mask=mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=dim ** -0.5,
                                              enable_gqa=True).transpose(1, 2)

    def decode_invariant(fn):  # the first rows alone, against the whole batch
        whole = fn()
        return torch.equal(fn(q[:7], k[:7], v[:7], mask[:7]), whole[:7])

    out.append(row("attention decode", f"batch={batch} cache={cache} filled={filled}",
                   timed(exact_decode, device, repeats), timed(default_decode, device, repeats),
                   decode_invariant(exact_decode), decode_invariant(default_decode)))
    # training: one packed row of `samples` samples
    length, samples = shapes["row"], shapes["samples"]
    q = torch.randn(1, heads, length, dim, device=device, dtype=dtype)
    k = torch.randn(1, kv_heads, length, dim, device=device, dtype=dtype)
    v = torch.randn_like(k)
    each = length // samples
    segment = torch.arange(length, device=device) // each
    slots = torch.arange(length, device=device)
    mask = ((segment[:, None] == segment[None, :]) & (slots[None, :] <= slots[:, None]))[None, None]

    def exact_train(q=q, k=k, v=v, mask=mask):
        return exact_attention_forward(module, q, k, v, mask, scaling=dim ** -0.5)[0]

    def default_train(q=q, k=k, v=v, mask=mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=dim ** -0.5,
                                              enable_gqa=True).transpose(1, 2)

    def packing_invariant(fn):  # the last sample alone (its own row), against the packed row
        last = slice(length - each, length)
        alone = fn(q[:, :, last], k[:, :, last], v[:, :, last], mask[..., last, last])
        return torch.equal(alone[0], fn()[0, last])

    out.append(row("attention packed row", f"tokens={length} samples={samples}",
                   timed(exact_train, device, repeats), timed(default_train, device, repeats),
                   packing_invariant(exact_train), packing_invariant(default_train)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="CPU, tiny shapes (smoke test)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.tiny:
        device, dtype = torch.device("cpu"), torch.float32
        batches, linears = (8, 256), {"q/o": (64, 128), "head": (64, 128)}
        hidden, mlp, vocab = 64, 176, 128
        shapes = dict(heads=4, kv_heads=2, dim=32, decode_batch=8, cache=64, filled=40, row=256,
                      samples=8)
    else:
        device, dtype = torch.device("cuda"), torch.bfloat16
        batches, linears, hidden, mlp, vocab = (8, 32, 256, 2048, 16384), LINEARS, HIDDEN, MLP, \
            VOCAB
        shapes = dict(heads=HEADS, kv_heads=KV_HEADS, dim=HEAD_DIM, decode_batch=256, cache=512,
                      filled=384, row=2048, samples=8)
    torch.manual_seed(0)
    rows = matmul_rows(device, dtype, batches, linears, args.repeats)
    rows += elementwise_rows(device, dtype, batches, hidden, mlp, args.repeats)
    rows += reduction_rows(device, dtype, (256, batches[-1]), hidden, vocab, args.repeats)
    rows += attention_rows(device, dtype, shapes, args.repeats)
    result = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
              "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "dtype": str(dtype), "rows": rows}
    print(f"{'kernel':<22} {'shape':<34} {'exact ms':>9} {'default ms':>10} {'ratio':>6} "
          f"{'exact inv.':>10} {'default inv.':>12}")
    for r in rows:
        print(f"{r['kernel']:<22} {r['shape']:<34} {r['exact_ms']:>9.4f} {r['default_ms']:>10.4f} "
              f"{r['exact_over_default']:>6.2f} {str(r['exact_rows_invariant']):>10} "
              f"{str(r['default_rows_invariant']):>12}")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()
