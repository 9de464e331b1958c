"""Where an RL step's time goes on one GPU: torch.profiler over one steady-state step of the
`bench/rl_throughput.py` setup (TinyLlama-1.1B shapes, embedded engine), with the step's phases
(rollout, old log-probs, update, weight sync) marked.

Prints the top operators by device time and by host time, and writes them (plus the time per
phase) as JSON:

    python3 bench/profile_rl_step.py --out $OUT/profile_rl_step.json [--override KEY=VALUE ...]
    python3 bench/profile_rl_step.py --tiny          # CPU smoke test
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from graft.config import compose
from graft.rl.job import RLJob
from graft.training.trainer import Trainer

SHAPES_1B = {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
             "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 64}
PHASES = {"generate": "rollout", "_add_logprobs": "log-prob passes", "_update": "update",
          "sync_weights": "weight sync"}


@contextlib.contextmanager
def marked_phases(job: RLJob) -> Iterator[None]:
    """Wrap the RL job's phases in profiler ranges (instance attributes, restored after)."""
    targets = {name: (job.rollout if name in ("generate", "sync_weights") else job)
               for name in PHASES}
    for name, owner in targets.items():
        original: Callable[..., Any] = getattr(owner, name)

        def marked(*args: Any, _original: Callable[..., Any] = original, _label: str = PHASES[name],
                   **kwargs: Any) -> Any:
            with record_function(f"phase: {_label}"):
                return _original(*args, **kwargs)

        setattr(owner, name, marked)
    try:
        yield
    finally:
        for name, owner in targets.items():
            delattr(owner, name)


def top(events: Any, key: str, count: int) -> list[dict[str, Any]]:
    rows = sorted(events, key=lambda e: getattr(e, key), reverse=True)[:count]
    return [{"name": e.key, "calls": e.count, "device_ms": round(e.device_time_total / 1e3, 2),
             "host_ms": round(e.cpu_time_total / 1e3, 2)} for e in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--override", nargs="*", default=[])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    shapes = {} if args.tiny else SHAPES_1B
    device = "cpu" if args.tiny else "cuda"
    with tempfile.TemporaryDirectory() as run_dir:
        cfg = compose([f"trainer.run_dir={run_dir}", "trainer.total_steps=3",
                       "model.preset=tiny-llama", f"engine.device={device}",
                       "rollout.prompts_per_step=32", "rollout.n=8",
                       f"rollout.max_new_tokens={8 if args.tiny else 256}", "optim.lr=1e-6",
                       "engine.max_tokens_per_micro_batch=16384", "checkpoint.every_steps=0",
                       "checkpoint.save_at_end=false", "export.hf_at_end=false",
                       *[f"+model.overrides.{k}={v}" for k, v in shapes.items()], *args.override])
        trainer = Trainer(cfg)
        trainer.train_step()  # warm-up: compilation, allocator, caches
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
        with profile(activities=activities) as prof, marked_phases(trainer.job):
            started = time.perf_counter()
            metrics = trainer.train_step()
            if device == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - started
        trainer.job.close()
    events = prof.key_averages()
    phases = [{"phase": e.key.removeprefix("phase: "), "host_ms": round(e.cpu_time_total / 1e3, 1)}
              for e in events if e.key.startswith("phase: ")]
    ops = [e for e in events if not e.key.startswith("phase: ")]
    result = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
              "step_s": seconds, "tokens": metrics["tokens"],
              "response_length": metrics["response_length"], "phases": phases,
              "top_device": top(ops, "device_time_total", 25),
              "top_host": top(ops, "cpu_time_total", 25)}
    print(f"step {seconds:.2f} s; phases: " + ", ".join(f"{p['phase']} {p['host_ms']} ms"
                                                       for p in phases))
    print(prof.key_averages().table(sort_by="cuda_time_total" if device == "cuda"
                                    else "cpu_time_total", row_limit=20, max_name_column_width=60))
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=1)


if __name__ == "__main__":
    main()
