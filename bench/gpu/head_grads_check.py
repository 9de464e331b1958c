"""GPU check of the chunked heads' linear-head gradients (`graft.engine.head.grads`, #26).

A bias-free bf16 ``nn.Linear`` head on CUDA takes `chunk_head_grads`' two products, the
weight's gradient summed by ``addmm`` into fp32; any other head goes through autograd (the
same head wrapped in a function takes that path here). For the chunked log-probs
(`chunked_head_logprobs`, backward) and the fused loss (`fused_head_loss`):

1. ``accuracy``: the weight's and the hidden states' gradients of both paths against an fp64
   reference (2048-dim hidden, 32K vocabulary, 8192 tokens in 2048-token chunks): relative
   errors, and the log-probs of both paths bit-equal.
2. ``timing``: forward + backward of the head alone at Llama-8B's head (4096 x 128,256) and
   32K tokens in 4096-token chunks, median of 5 after a warm-up, each path.
3. ``kernels``: the Triton log-prob kernels (`graft.engine.head.triton_logprobs`) against the same
   math compiled by ``torch.compile`` (dynamic shapes, what they replace) on one 4096-token
   chunk of a 128,256 vocabulary in bf16: largest differences and median milliseconds.

    python3 bench/gpu/head_grads_check.py --out $OUT/head_grads_check.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import torch

from graft.engine.head.chunked import chunked_head_logprobs
from graft.engine.head.fused_loss import fused_head_loss
from graft.engine.head.grads import linear_head_weight


def relative(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got.double() - expected).norm() / expected.norm().clamp_min(1e-30))


def run_head(kind: str, head: torch.nn.Linear, hidden: torch.Tensor, labels: torch.Tensor,
             chunk: int, fast: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probs and the gradients (weight, hidden) of minus the mean log-prob; ``fast`` false
    passes the head as a function (autograd's path)."""
    head.weight.grad = None
    h = hidden.detach().requires_grad_()
    use = head if fast else (lambda x: head(x))
    params = [head.weight]
    assert (linear_head_weight(use, params) is not None) == fast
    count = labels.numel()
    if kind == "fused":
        logp, _, loss = fused_head_loss(use, h, labels, None, lambda _t, lp: -lp.sum() / count,
                                        chunk_tokens=chunk, params=params)
    else:
        logp, _ = chunked_head_logprobs(use, h, labels, None, chunk_tokens=chunk, params=params)
        loss = -logp.sum() / count
    loss.backward()
    return logp.detach(), head.weight.grad.clone(), h.grad.clone()


def random_head(hidden_size: int, vocab: int, tokens: int, device: torch.device
                ) -> tuple[torch.nn.Linear, torch.Tensor, torch.Tensor]:
    """A bf16 bias-free head (seed 0), random hidden states and labels."""
    torch.manual_seed(0)
    head = torch.nn.Linear(hidden_size, vocab, bias=False, device=device, dtype=torch.bfloat16)
    torch.nn.init.normal_(head.weight, std=0.02)
    hidden = torch.randn(tokens, hidden_size, device=device, dtype=torch.bfloat16)
    return head, hidden, torch.randint(0, vocab, (tokens,), device=device)


def accuracy(device: torch.device) -> list[dict[str, Any]]:
    tokens, chunk = 8192, 2048
    head, hidden, labels = random_head(2048, 32000, tokens, device)
    weight64 = head.weight.detach().double().requires_grad_()
    h64 = hidden.double().requires_grad_()
    logp64 = torch.log_softmax(h64 @ weight64.t(), -1).gather(-1, labels[:, None])
    (-logp64.sum() / tokens).backward()
    rows = []
    for kind in ("chunked", "fused"):
        results = {fast: run_head(kind, head, hidden, labels, chunk, fast) for fast in (True, False)}
        rows.append({"head": kind, "logprobs_bit_equal": torch.equal(results[True][0],
                                                                     results[False][0])})
        for fast, (_, grad_w, grad_h) in results.items():
            rows[-1][f"{'linear' if fast else 'autograd'}_weight_relative"] = relative(
                grad_w, weight64.grad)
            rows[-1][f"{'linear' if fast else 'autograd'}_hidden_relative"] = relative(
                grad_h, h64.grad)
    return rows


def timing(device: torch.device, repeats: int) -> list[dict[str, Any]]:
    chunk = 4096
    head, hidden, labels = random_head(4096, 128256, 32768, device)
    rows = []
    for kind in ("chunked", "fused"):
        for fast in (True, False):
            run_head(kind, head, hidden, labels, chunk, fast)
            seconds = []
            for _ in range(repeats):
                torch.cuda.synchronize(device)
                started = time.perf_counter()
                run_head(kind, head, hidden, labels, chunk, fast)
                torch.cuda.synchronize(device)
                seconds.append(time.perf_counter() - started)
            rows.append({"head": kind, "path": "linear" if fast else "autograd",
                         "median_ms": round(statistics.median(seconds) * 1e3, 2),
                         "peak_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2)})
            torch.cuda.reset_peak_memory_stats(device)
    return rows


def median_ms(fn, device: torch.device, repeats: int = 10) -> float:
    fn()
    seconds = []
    for _ in range(repeats):
        torch.cuda.synchronize(device)
        started = time.perf_counter()
        fn()
        torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - started)
    return round(statistics.median(seconds) * 1e3, 3)


def kernels(device: torch.device) -> dict[str, Any]:
    from graft.engine.head.logprobs import _backward_math, _forward_math
    from graft.engine.head.triton_logprobs import triton_backward, triton_forward

    torch.manual_seed(0)
    tokens, vocab = 4096, 128256
    logits = (torch.randn(tokens, vocab, device=device) * 4).to(torch.bfloat16)
    labels = torch.randint(0, vocab, (tokens,), device=device)
    inv_t = torch.full((tokens,), 1 / 0.7, device=device)
    grad = torch.randn(tokens, device=device)
    compiled_forward = torch.compile(_forward_math, dynamic=True)
    compiled_backward = torch.compile(_backward_math, dynamic=True)
    logp, lse = triton_forward(logits, labels, inv_t)
    want_logp, want_lse = compiled_forward(logits, labels, inv_t)
    got = triton_backward(logits, labels, inv_t, lse, grad).float()
    want = compiled_backward(logits, labels, inv_t, want_lse, grad).float()
    return {"logp_max_abs_diff": float((logp - want_logp).abs().max()),
            "lse_max_abs_diff": float((lse - want_lse).abs().max()),
            "grad_max_abs_diff": float((got - want).abs().max()),
            "grad_max_abs": float(want.abs().max()),
            "forward_ms": {"triton": median_ms(lambda: triton_forward(logits, labels, inv_t), device),
                           "compiled": median_ms(lambda: compiled_forward(logits, labels, inv_t),
                                                 device)},
            "backward_ms": {"triton": median_ms(
                lambda: triton_backward(logits, labels, inv_t, lse, grad), device),
                "compiled": median_ms(
                lambda: compiled_backward(logits, labels, inv_t, want_lse, grad), device)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    device = torch.device("cuda")
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
                              "gpu": torch.cuda.get_device_name(device)}
    result["kernels"] = kernels(device)
    print(json.dumps(result["kernels"]), flush=True)
    result["accuracy"] = accuracy(device)
    print(json.dumps(result["accuracy"]), flush=True)
    result["timing"] = timing(device, args.repeats)
    print(json.dumps(result["timing"]), flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
