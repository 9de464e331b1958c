"""Where an RL update's GPU time goes: bench/lora.py's 8B LoRA run (``graft`` part), with
torch.profiler over the ``--step``-th step's update passes (started at its first ``update``
pass and stopped at the next rollout, by a ``graft_compute`` wrapper), then the kernels by GPU
time: the top 45, their total and count, and the update's wall time.

    python3 bench/gpu/profile_update.py --step 3 --overrides model.dtype=bfloat16 \\
        --out $R/profile_update.json
    python3 bench/gpu/profile_update.py --tiny --step 2 --out /tmp/p.json   # CPU smoke test
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from graft import hookimpl
from graft.plugins import get_plugin_manager

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import lora  # noqa: E402  (bench/lora.py: the run's config)


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class UpdateProfiler:
    """A plugin: profiles the ``step``-th update (its passes between two rollouts)."""

    def __init__(self, step: int) -> None:
        self.step, self.updates, self.phase = step, 0, None
        cuda = [ProfilerActivity.CUDA] if torch.cuda.is_available() else []
        self.prof = profile(activities=[*cuda, ProfilerActivity.CPU])
        self.running, self.started, self.wall_s = False, 0.0, None

    @hookimpl(wrapper=True)
    def graft_compute(self, phase: str) -> Generator[None, Any, Any]:
        if phase != self.phase:
            if phase == "update":
                self.updates += 1
                if self.updates == self.step:
                    synchronize()
                    self.prof.start()
                    self.running, self.started = True, time.perf_counter()
            elif self.running:
                self.stop()
            self.phase = phase
        return (yield)

    def stop(self) -> None:
        synchronize()
        self.wall_s = time.perf_counter() - self.started
        self.prof.stop()
        self.running = False

    def kernels(self) -> list[Any]:
        """The profiled kernels (CPU ops without a GPU), longest first."""
        on_gpu = torch.cuda.is_available()
        events = [e for e in self.prof.key_averages()
                  if not on_gpu or (e.device_type.name == "CUDA" and e.self_device_time_total)]
        key = (lambda e: -e.self_device_time_total) if on_gpu else (lambda e: -e.self_cpu_time_total)
        return sorted(events, key=key)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step", type=int, default=3, help="the update to profile (1-based)")
    parser.add_argument("--overrides", nargs="*", default=[], help="more Graft settings")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes on CPU (smoke test)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    profiler = UpdateProfiler(args.step)
    get_plugin_manager().register(profiler, name="update-profiler")
    from graft.training.trainer import Trainer

    run_args = argparse.Namespace(tiny=args.tiny, rank=32, graft_overrides=args.overrides)
    with tempfile.TemporaryDirectory() as run_dir:
        cfg = lora.graft_config(run_args, run_dir, shape="qwen3-8b", lora=True,
                                max_new_tokens=256, prompts=8, n=8, steps=args.step + 1, extra=[])
        history = Trainer(cfg).fit()
    if profiler.running:
        profiler.stop()
    kernels = profiler.kernels()
    ms = ((lambda e: e.self_device_time_total / 1e3) if torch.cuda.is_available()
          else (lambda e: e.self_cpu_time_total / 1e3))
    result = {"overrides": args.overrides, "step": args.step, "history": history,
              "update_wall_s": profiler.wall_s,
              "kernel_ms_total": round(sum(ms(e) for e in kernels), 1),
              "kernels": sum(e.count for e in kernels),
              "top": [{"name": e.key[:120], "count": e.count, "ms": round(ms(e), 2)}
                      for e in kernels[:45]]}
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps({k: v for k, v in result.items() if k != "history"}, indent=0))


if __name__ == "__main__":
    main()
