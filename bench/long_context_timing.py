"""Step times of `long_context.py`: each variant against ``today``'s and Liger's, the same
again with the variants interleaved, and a step's time extrapolated to a longer length."""

from __future__ import annotations

import functools
import json
import statistics
from collections.abc import Callable, Sequence

import torch
from timing import interleaved


def compare_times(rows: list[dict]) -> dict:
    """Each variant's step time against ``today``'s (and Liger's) at the timed lengths."""
    base = {r["tokens"]: r["step_s"] for r in rows if r["variant"] == "today" and "step_s" in r}
    liger = {r["tokens"]: r["step_s"] for r in rows if r["variant"] == "liger" and "step_s" in r}
    out = {}
    for r in rows:
        if "step_s" in r and r["tokens"] in base:
            out.setdefault(r["variant"], {})[str(r["tokens"])] = {
                "vs_today": round(r["step_s"] / base[r["tokens"]] - 1, 4),
                **({"vs_liger": round(r["step_s"] / liger[r["tokens"]] - 1, 4)}
                   if r["tokens"] in liger else {})}
    return {"step_time_vs_today": out}


def interleaved_times(step: Callable[[str, torch.Tensor], None], rows: list[dict], *,
                      lengths: Sequence[int], rounds: int, vocab: int,
                      device: torch.device) -> dict:
    """Step times of the variants timed in ``rows``, again, one step of each in turn for
    ``rounds`` rounds at each of ``lengths`` (`timing.interleaved`; ``step(variant, ids)`` runs
    one): the median per variant, and the medians against ``today``'s and Liger's. The
    comparison the acceptance reads: back-to-back runs of one variant carry the drift of the
    run into its mean."""
    out: dict = {}
    for tokens in lengths:
        ids = torch.randint(0, vocab, (1, tokens), device=device,
                            generator=torch.Generator(device=device).manual_seed(tokens))
        variants = [r["variant"] for r in rows if r.get("tokens") == tokens and "step_s" in r
                    and "offload" not in r["variant"]]
        seconds = interleaved({v: functools.partial(step, v, ids) for v in variants},
                              rounds=rounds, device=device)
        medians = {v: statistics.median(s) for v, s in seconds.items()}
        for variant, median in medians.items():
            entry = {"median_s": round(median, 4), "steps_s": [round(x, 4) for x in seconds[variant]]}
            for base in ("today", "liger"):
                if base in medians:
                    entry[f"vs_{base}"] = round(median / medians[base] - 1, 4)
            out.setdefault(variant, {})[str(tokens)] = entry
        print(json.dumps({"interleaved": tokens, **{v: out[v][str(tokens)] for v in medians}}),
              flush=True)
    return {"step_time_interleaved": out, "interleave_rounds": rounds}


def step_seconds(rows: list[dict], variant: str, tokens: int) -> float | None:
    """A step at ``tokens`` from ``variant``'s timed rows: ``a t + b t^2`` through the two
    longest (attention is quadratic), or linear from one."""
    timed = sorted((r["tokens"], r["step_s"]) for r in rows
                   if r["variant"] == variant and "step_s" in r)
    if not timed:
        return None
    if len(timed) == 1:
        t, s = timed[0]
        return s * tokens / t
    (t1, s1), (t2, s2) = timed[-2:]
    b = (s2 / t2 - s1 / t1) / (t2 - t1)
    a = s1 / t1 - b * t1
    return max(a, 0.0) * tokens + max(b, 0.0) * tokens ** 2
