"""graft-math's reward throughput: one RL step's responses scored inline (one at a time in the
trainer's thread, as Graft does without graft-reward-pool), in a thread pool and in process
pools (graft-reward-pool, which this benchmark needs).

Each response is a short GSM8K-style solution ending in an answer (\\boxed{}, "#### N", or a
LaTeX fraction), half of them right; every batch has new problems (as every RL step has new
prompts), so no cache of parsed ground truths carries over. The pools are started and warmed
(one batch) before the timed batches. Prints a table and writes JSON:

    python3 bench/math_reward.py --samples 256 --out bench/results/math_reward.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

from graft.config import compose
from graft.data.tasks import TextSample
from graft.rl.rewards import RewardScorer


def batch(count: int, seed: int = 0) -> tuple[list[str], list[TextSample]]:
    """``count`` (response, sample) pairs; every other response is right."""
    rng = random.Random(seed)
    responses, samples = [], []
    for index in range(count):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        truth = a + b if index % 4 < 2 else f"\\frac{{{a}}}{{{b}}}"
        given = truth if index % 2 == 0 else (a + b + 1 if index % 4 < 2 else f"\\frac{{{a}}}{{{b + 1}}}")
        style = index % 3
        steps = f"First {a} and then {b}; together that is {a} + {b}. "
        answer = (f"\\boxed{{{given}}}" if style == 0 or index % 4 >= 2
                  else f"\n#### {given}" if style == 1 else f"$\\boxed{{{given}}}$")
        responses.append(f"Let's think step by step. {steps}So the answer is {answer}.")
        samples.append(TextSample("q", "", str(truth), origin=f"row {index + 1}"))
    return responses, samples


def inline(responses: list[str], samples: list[TextSample], cfg) -> list[float]:
    """The peer: each sample in the calling (main) thread, one after the other."""
    from graft_math.reward import math_reward

    return [math_reward(r, s, cfg) for r, s in zip(responses, samples, strict=True)]


def timed_batches(score, batches: list[tuple[list[str], list[TextSample]]]) -> float:
    """Mean seconds per batch after the first (the warm-up: workers started, modules
    imported)."""
    score(*batches[0])
    started = time.perf_counter()
    for responses, samples in batches[1:]:
        scores = score(responses, samples)
        assert sum(scores) == len(scores) / 2, scores
    return (time.perf_counter() - started) / (len(batches) - 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    batches = [batch(args.samples, seed) for seed in range(args.repeats + 1)]
    rows = []
    cfg = compose(["algorithm.reward=math"])
    seconds = timed_batches(lambda r, s: inline(r, s, cfg), batches)
    rows.append({"variant": "inline (main thread)", "workers": 1, "batch_s": seconds})
    for pool, workers in (("thread", 4), ("process", 1), ("process", 2), ("process", 4)):
        cfg = compose(["algorithm.reward=math", f"features.reward_pool.kind={pool}",
                       f"features.reward_pool.workers={workers}"])
        scorer = RewardScorer(batches[0][1], cfg=cfg)
        try:
            seconds = timed_batches(scorer.score, batches)
        finally:
            scorer.close()
        rows.append({"variant": f"{pool} pool", "workers": workers, "batch_s": seconds})
    for row in rows:
        row["samples_per_s"] = args.samples / row["batch_s"]
    print(f"{args.samples} responses per batch, mean of {args.repeats} batches, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print("| variant | workers | batch s | samples/s |\n|---|---:|---:|---:|")
    for row in rows:
        print(f"| {row['variant']} | {row['workers']} | {row['batch_s']:.3f} | "
              f"{row['samples_per_s']:.0f} |")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"samples": args.samples, "repeats": args.repeats, "cpus": os.cpu_count(),
                       "rows": rows}, handle, indent=1)


if __name__ == "__main__":
    main()
