"""GPU check of graft-async-rl (#38) on one GPU: a rollout worker and a trainer as two processes
sharing the card (`graft.engine.ranks_share_gpus`: weights and samples cross in host memory over
gloo), against the colocated run on the same card. No speed is claimed from one GPU.

Runs of the default task (every setting at its default, `auto` resolved on CUDA), each
``graft train`` in a process of its own:
``colocated`` (1 rank), ``k0`` (1 trainer + 1 worker, ``max_staleness=0``: must sample and
train as the colocated run), ``k1`` (one-step-off), ``k1_resumed`` (a copy of ``k1`` resumed
from its step-6 checkpoint: must repeat ``k1``'s metrics) and ``k2_partial`` (two steps off,
partial rollouts switching after 4 of the 8 tokens). Reported: each run's metrics per step, the
largest difference of ``k0`` from ``colocated`` per metric, ``k1``'s staleness and correction
metrics, whether the resumed run repeats ``k1``, and ``k2_partial``'s staleness per step.

    python3 bench/gpu/async_rl_check.py --out $OUT/async_rl_check.json
    python3 bench/gpu/async_rl_check.py --device cpu --steps 4 --out /tmp/a.json   # smoke test
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMPARED = ("loss", "grad_norm", "entropy", "reward_mean", "response_length")
CLOCK = ("time", "_s", "per_s", "idle_share", "peak_memory", "compile_cache")


def train(run_dir: Path, nproc: int, *args: str) -> dict:
    """One ``graft train`` run; its exit code, seconds and metrics rows."""
    command = [sys.executable, "-m", "graft", "train", *(["--nproc", str(nproc)] if nproc > 1
                                                        else []), f"trainer.run_dir={run_dir}",
               *args]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    print(f"{run_dir.name}: exit {done.returncode} in {seconds:.1f}s", flush=True)
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-6000:], flush=True)
    metrics = run_dir / "metrics.jsonl"
    rows = ([json.loads(line) for line in metrics.read_text().splitlines()]
            if metrics.exists() else [])
    return {"exit": done.returncode, "seconds": round(seconds, 1), "rows": rows}


def largest_differences(rows: list[dict], reference: list[dict]) -> dict[str, float]:
    """Per compared metric, the largest absolute difference over the steps both ran."""
    return {name: max((abs(a[name] - b[name]) for a, b in zip(rows, reference, strict=False)
                       if name in a and name in b), default=float("nan"))
            for name in COMPARED}


def without_clock(row: dict) -> dict:
    return {k: v for k, v in row.items() if not any(part in k for part in CLOCK)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    common = [f"engine.device={args.device}", f"trainer.total_steps={args.steps}",
              "checkpoint.every_steps=6", "checkpoint.save_at_end=false",
              "export.hf_at_end=false", "rollout.seeded_sampling=true"]

    def workers(k: int) -> list[str]:
        return ["features.async_rl.workers=1", f"features.async_rl.max_staleness={k}"]

    result: dict = {
        "command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"),
        "measures": "graft-async-rl on one GPU: a trainer and a rollout worker as two processes "
                    f"sharing the card, against the colocated run (default task, {args.steps} "
                    "steps; no speed claimed)",
        "headline": "k=0 vs colocated: largest loss difference "
                    "{k0_vs_colocated_max_abs_diff.loss:.1e}, reward "
                    "{k0_vs_colocated_max_abs_diff.reward_mean:.1e}; k=1 staleness max "
                    "{k1_staleness_max.-1}, resumed run repeats it: {k1_resumed_repeats_k1}; "
                    "k=2 partial rollouts: token staleness mean "
                    "{k2_partial_staleness_mean_max.-1.0:.2f}, max "
                    "{k2_partial_staleness_mean_max.-1.1}",
        "runs": {}}
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        runs = result["runs"]
        runs["colocated"] = train(root / "colocated", 1, *common)
        runs["k0"] = train(root / "k0", 2, *common, *workers(0))
        runs["k1"] = train(root / "k1", 2, *common, *workers(1))
        if (root / "k1" / "checkpoints" / "step_6").exists():
            shutil.copytree(root / "k1", root / "k1_resumed")
            runs["k1_resumed"] = train(root / "k1_resumed", 2, *common, *workers(1),
                                       f"checkpoint.resume={root / 'k1_resumed' / 'checkpoints' / 'step_6'}")
        runs["k2_partial"] = train(root / "k2_partial", 2, *common, *workers(2),
                                   "features.async_rl.partial_tokens=4")
    k1 = runs["k1"]["rows"]
    result["k0_vs_colocated_max_abs_diff"] = largest_differences(runs["k0"]["rows"],
                                                                 runs["colocated"]["rows"])
    result["k1_staleness_max"] = [row.get("async_rl/staleness_max") for row in k1]
    result["k1_correction_present"] = all("rollout_correction/weight_mean" in r for r in k1)
    result["k2_partial_staleness_mean_max"] = [
        (row.get("async_rl/staleness_mean"), row.get("async_rl/staleness_max"))
        for row in runs["k2_partial"]["rows"]]
    if "k1_resumed" in runs:
        result["k1_resumed_repeats_k1"] = ([without_clock(r) for r in runs["k1_resumed"]["rows"]]
                                           == [without_clock(r) for r in k1])
    try:
        import torch

        result["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    except ImportError:
        pass
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))


if __name__ == "__main__":
    main()
