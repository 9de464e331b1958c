"""Where a rollout's time goes: one more rollout of a trained `Trainer`'s RL job, run under
torch.profiler, summarised as its wall time, the time the GPU was busy (the union of kernel and
copy intervals), the kernels by total time and the host ops by self time; with Graft's graphed
decode loop also the batch sizes it stepped at and one graph replay's time per batch size.

Imported by ``rl_throughput.py --profile-rollout PATH`` (Python puts a script's own folder first
on its path).
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from timing import sync

from graft.training.trainer import Trainer


def profile_rollout(trainer: Trainer, *, top: int = 40) -> dict[str, Any]:
    """Profile one rollout of ``trainer``'s job on the prompts of its next step."""
    from torch.profiler import ProfilerActivity, profile

    job = trainer.job
    indices = job.sampler.next_batch(job.cfg.rollout.prompts_per_step)
    prompts = [job.prompts[i] for i in indices for _ in range(job.cfg.rollout.n)]
    device = trainer.engine.env.device
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync(device)
    with profile(activities=activities) as prof:
        started = time.perf_counter()
        samples = job.rollout.generate(prompts, job.spec)
        sync(device)
        wall_s = time.perf_counter() - started
    generated = sum(len(s.response_ids) for s in samples)
    result = {"wall_s": round(wall_s, 4), "generated_tokens": generated,
              "tokens_per_s": round(generated / wall_s), **_device_summary(prof, top)}
    decoder = getattr(job.rollout, "decoder", None)
    if decoder is not None:
        sys.path.insert(0, str(Path(__file__).parent / "gpu"))
        from graphed_decode_check import replay_ms

        result["batch_sizes"] = decoder.batch_sizes
        result["replay_ms"] = replay_ms(decoder, repeats=50, warmup=5)
    return result


def _device_summary(prof: Any, top: int) -> dict[str, Any]:
    """GPU busy time and kernels by total time; host ops by self time."""
    kernels: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    host: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    intervals = []
    for event in prof.events():
        if event.device_type.name == "CUDA":
            kernels[event.name][0] += 1
            kernels[event.name][1] += event.device_time
            start = event.time_range.start
            intervals.append((start, start + event.device_time))
        else:
            host[event.name][0] += 1
            host[event.name][1] += event.self_cpu_time_total
    return {"gpu_busy_s": round(_union_us(intervals) / 1e6, 4),
            "kernel_s": round(sum(us for _, us in kernels.values()) / 1e6, 4),
            "kernel_count": sum(count for count, _ in kernels.values()),
            "kernels": _ranked(kernels, top), "host_ops": _ranked(host, 20)}


def _union_us(intervals: list[tuple[float, float]]) -> float:
    """Microseconds covered by at least one of ``intervals``."""
    covered, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop > end:
            covered += stop - max(start, end)
            end = stop
    return covered


def _ranked(totals: dict[str, list[float]], top: int) -> list[dict[str, Any]]:
    ordered = sorted(totals.items(), key=lambda item: -item[1][1])
    return [{"name": name[:100], "count": count, "us": round(us, 1)}
            for name, (count, us) in ordered[:top]]
