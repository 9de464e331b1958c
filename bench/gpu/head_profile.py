"""Where the head's time goes: forward + backward of the loss through Llama-8B's head (4096 x
128,256, bf16) at 32K tokens, under torch.profiler, for the fused head
(`graft.engine.head.fused_loss`, 4096-token chunks) and Liger-Kernel's
``LigerFusedLinearCrossEntropyLoss`` (when importable): wall time (median of 5) and the
kernels by total time.

    python3 bench/gpu/head_profile.py --out $OUT/head_profile.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

from graft.engine.head.fused_loss import fused_head_loss


def fused_step(head: torch.nn.Linear, hidden: torch.Tensor, labels: torch.Tensor,
               chunk: int) -> Callable[[], None]:
    count = labels.numel()

    def step() -> None:
        h = hidden.detach().requires_grad_()
        _, _, loss = fused_head_loss(head, h, labels, None, lambda _t, lp: -lp.sum() / count,
                                     chunk_tokens=chunk, params=[head.weight])
        loss.backward()
        head.weight.grad = None
    return step


def liger_step(head: torch.nn.Linear, hidden: torch.Tensor,
               labels: torch.Tensor) -> Callable[[], None]:
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

    loss_fn = LigerFusedLinearCrossEntropyLoss()

    def step() -> None:
        h = hidden.detach().requires_grad_()
        loss_fn(head.weight, h, labels).backward()
        head.weight.grad = None
    return step


def profile_step(step: Callable[[], None], device: torch.device, top: int) -> dict[str, Any]:
    """``step``'s median wall time over 5 (after one) and its kernels in one profiled call."""
    from torch.profiler import ProfilerActivity, profile

    step()
    seconds = []
    for _ in range(5):
        torch.cuda.synchronize(device)
        started = time.perf_counter()
        step()
        torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - started)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize(device)
    kernels: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            entry = kernels[event.name[:110]]
            entry[0] += 1
            entry[1] += event.device_time
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1][1])
    return {"median_ms": round(statistics.median(seconds) * 1e3, 2),
            "kernel_ms": round(sum(v[1] for v in kernels.values()) / 1e3, 2),
            "kernels": [{"name": k, "count": v[0], "ms": round(v[1] / 1e3, 3)}
                        for k, v in ranked[:top]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--chunk", type=int, default=4096)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    device = torch.device("cuda")
    torch.manual_seed(0)
    head = torch.nn.Linear(4096, 128256, bias=False, device=device, dtype=torch.bfloat16)
    torch.nn.init.normal_(head.weight, std=0.02)
    hidden = torch.randn(args.tokens, 4096, device=device, dtype=torch.bfloat16)
    labels = torch.randint(0, 128256, (args.tokens,), device=device)
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
                              "gpu": torch.cuda.get_device_name(device), "tokens": args.tokens,
                              "chunk": args.chunk}
    result["fused"] = profile_step(fused_step(head, hidden, labels, args.chunk), device, args.top)
    print(json.dumps(result["fused"], indent=1), flush=True)
    if importlib.util.find_spec("liger_kernel") is not None:
        result["liger"] = profile_step(liger_step(head, hidden, labels), device, args.top)
        print(json.dumps(result["liger"], indent=1), flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
