"""pad_to_length: recompiles, compile seconds and tokens forwarded, with and without buckets.

A realistic RL stream (lognormal response lengths, packed into micro-batches under a token budget
and balanced by workload, as `graft train` does) runs forward+backward through a model whose
decoder blocks are compiled with ``torch.compile(dynamic=False)``. CPU is fine: compile cost,
not speed, is what is measured.

    python3 bench/pad_to_length.py --steps 8 --out bench/results/pad_to_length.json
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch
import torch._dynamo.utils as dynamo_utils
import torch._functorch.config
import torch._inductor.config

from graft.config import compose
from graft.engine.batch.micro_batch import TokenSample
from graft.engine.distributed.env import init_distributed
from graft.engine.distributed.parallelize import apply_compile
from graft.training.sft import sft_loss
from graft.training.trainer import build_engine


def rl_stream(steps: int, batch: int, seed: int) -> list[list[TokenSample]]:
    """Per step, ``batch`` samples: prompt 32-160 tokens, response lognormal (median ~245, e^5.5)."""
    rng = random.Random(seed)
    out = []
    for _ in range(steps):
        samples = []
        for _ in range(batch):
            prompt = rng.randint(32, 160)
            response = min(1536, max(8, int(rng.lognormvariate(5.5, 0.7))))
            samples.append(TokenSample([rng.randint(3, 99) for _ in range(prompt + response)],
                                       prompt))
        out.append(samples)
    return out


def compile_seconds() -> float:
    metrics = dynamo_utils.compilation_time_metrics
    return sum(metrics.get("_compile.compile_inner", [])) + sum(
        metrics.get("compile_fx.<locals>.bw_compiler", []))


def run(stream: list[list[TokenSample]], *, bucket: int | None, budget: int) -> dict:
    torch._dynamo.reset()
    dynamo_utils.compilation_time_metrics.clear()
    dynamo_utils.counters.clear()
    overrides = ["model.preset=tiny-llama", "engine.device=cpu", "trainer.mode=sft",
                 f"engine.max_tokens_per_micro_batch={budget}"]
    if bucket:
        overrides += ["engine.pad_to_length=true", f"engine.pad_to_length_bucket={bucket}"]
    cfg = compose(overrides)
    engine = build_engine(cfg, init_distributed(device_preference="cpu"), pad_token_id=0)
    apply_compile(engine.family.decoder_blocks(engine.model), dynamic=False)
    shapes, real, forwarded = set(), 0, 0
    started = time.perf_counter()
    for samples in stream:
        batches = engine.micro_batches(samples)
        for batch in batches:
            shapes.add(tuple(batch.tensors["input_ids"].shape))
            real += sum(s.length for s in batch.layout.segments)
            forwarded += batch.tensors["input_ids"].numel()
        engine.forward_backward(batches, sft_loss, loss_scale_factor=1.0)
        engine.optimizer_step()
    return {"bucket": bucket,
            "micro_batches": sum(len(engine.micro_batches(s)) for s in stream),
            "distinct_shapes": len(shapes),
            "graphs_compiled": dynamo_utils.counters["stats"]["unique_graphs"],
            "compile_seconds": round(compile_seconds(), 2),
            "wall_seconds": round(time.perf_counter() - started, 2),
            "real_tokens": real, "tokens_forwarded": forwarded,
            "padding_overhead": round(forwarded / real - 1, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=48)
    parser.add_argument("--budget", type=int, default=8192)
    parser.add_argument("--bucket", type=int, default=1024)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch._dynamo.config.recompile_limit = 10_000  # count every recompile, never fall back
    torch._dynamo.config.accumulated_recompile_limit = 10_000
    # No on-disk caches: each run pays its own compiles, as a fresh job would.
    torch._inductor.config.fx_graph_cache = False
    torch._functorch.config.enable_autograd_cache = False
    # Pay inductor's one-time start-up (toolchain, codecache) before either measured run.
    torch.compile(torch.nn.Linear(4, 4))(torch.randn(2, 4)).sum().backward()
    stream = rl_stream(args.steps, args.batch, seed=0)
    rows = [run(stream, bucket=None, budget=args.budget),
            run(stream, bucket=args.bucket, budget=args.budget)]
    print(f"{'bucket':>8} {'micro-batches':>14} {'shapes':>7} {'graphs':>7} {'compile s':>10} "
          f"{'tokens fwd':>11} {'pad overhead':>13}")
    for r in rows:
        print(f"{str(r['bucket']):>8} {r['micro_batches']:>14} {r['distinct_shapes']:>7} "
              f"{r['graphs_compiled']:>7} {r['compile_seconds']:>10} {r['tokens_forwarded']:>11} "
              f"{r['padding_overhead']:>13.2%}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        report = {"date": time.strftime("%Y-%m-%d"), "args": vars(args) | {"out": str(args.out)},
                  "torch": torch.__version__, "results": rows}
        args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
