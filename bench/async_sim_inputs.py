#!/usr/bin/env python3
"""Inputs and checks of the async-RL event model ``async_sim.py`` (issue 38, item 6).

What: builds the model's inputs files from measured results (``make_inputs``: the H100 1.1B and 8B
setups from bench/results; ``cpu_inputs``: this repository's CPU runs of ``graft train`` colocated
and with graft-async-rl's workers), rebuilds verl's published 128-GPU fully-async setup from that
setup's own numbers (``verl_setup``, ``check_verl``), and compares predicted step times with measured
runs (``compare_measured``).
When: after new measurements (rebuild the inputs), and to check the model (``async_sim.py
--check-verl`` / ``--measured SPEC``; ``python bench/async_sim_inputs.py --cpu-inputs RUN_DIR...``
writes inputs_cpu.json). Units: seconds, tokens, GB (1e9 bytes), as in ``async_sim``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from async_sim import (  # noqa: E402  (bench/async_sim.py: the model)
    RESULTS,
    Pipeline,
    Setup,
    Simulation,
    interp,
    load_setup,
    predict,
    preset,
    simulate,
)

# ---------------------------------------------------------------- verl's published fully-async run
VERL = {"doc": "volcengine/verl docs/advance/fully_async.md (b178a3c, 2026-01-29), 128 H20, "
               "Qwen2.5-Math-7B DAPO",
        "colocate_128": {"step": 356.30, "gen": 177.85, "old_log_prob": 53.92, "update_actor": 113.81},
        "colocate_64": {"step": 365.28, "gen": 150.72, "old_log_prob": 70.26, "update_actor": 133.41},
        "async_64_64": {"step": 150.63, "gen": 33.14, "update_actor": 113.16},
        "published_ratio_400_steps": 2.35, "prompts": 512, "n": 16, "max_response": 28 * 1024,
        "gen_tp": 4, "concurrent_prompts_per_server": 16, "staleness_threshold": 0.5,
        "trigger_parameter_sync_step": 4, "sync_s": 0.02}
H20 = {"tflops_bf16": 148e12, "hbm_bytes_per_s": 4.0e12}
QWEN7B = {"params": 7.62e9, "layers": 28, "kv_heads": 4, "head_dim": 128}


def lognormal_lengths(median: float, sigma: float, cap: int, n: int = 4000) -> list:
    """n quantiles of a lognormal response-length law, capped (a deterministic 'empirical' list)."""
    nd = statistics.NormalDist()
    return [min(cap, max(1, round(median * math.exp(sigma * nd.inv_cdf((i + 0.5) / n))))) for i in range(n)]


def verl_setup(median: float = 1500, sigma: float = 1.0, prompt: float = 300, mfu: float = 0.5) -> tuple:
    """verl's 128-GPU setup from its own numbers; returns (setup, colocated, async, assumptions)."""
    v, steps = VERL, (2, 4)
    lengths = lognormal_lengths(median, sigma, v["max_response"])
    mean = statistics.fmean(lengths)
    ctx = prompt + statistics.fmean(x * x for x in lengths) / (2 * mean)  # context a live sequence sees
    kv = 2 * QWEN7B["layers"] * QWEN7B["kv_heads"] * QWEN7B["head_dim"] * 2 / v["gen_tp"]
    per_seq = (2 * QWEN7B["params"] / v["gen_tp"] / (H20["tflops_bf16"] * mfu)
               + kv * ctx / H20["hbm_bytes_per_s"])
    tokens = v["prompts"] * v["n"] * (prompt + mean)
    c128, c64 = v["colocate_128"], v["colocate_64"]
    setup = Setup(decode_table=[[1, 0.0], [256, 0.0]], lengths=lengths, prompt_tokens=prompt,
                  update_tokens_per_s_per_gpu=[[64, tokens / c64["update_actor"] / 64],
                                               [128, tokens / c128["update_actor"] / 128]],
                  weight_gb=15.2, prompts_per_step=v["prompts"], group_size=v["n"],
                  gpus_per_engine=v["gen_tp"],
                  max_seqs_per_engine=v["concurrent_prompts_per_server"] * v["n"], continuous=True,
                  logprob_pass_fraction=c128["old_log_prob"] / c128["update_actor"],
                  step_overhead_s=c128["step"] - c128["gen"] - c128["old_log_prob"] - c128["update_actor"],
                  sync_colocated_gb_per_s=15.2 / v["sync_s"], sync_inter_node_gb_per_s=15.2 / v["sync_s"])
    colo = Pipeline("colocated", 128, 0, max_staleness=0, buffer_batches=1, recompute_old_logprobs=True)
    lo, hi = 0.0, c128["gen"]
    for _ in range(40):  # fixed cost a of a decode step so that the colocated gen time is verl's
        a = (lo + hi) / 2
        setup.decode_table = [[1, a + per_seq], [256, a + 256 * per_seq]]
        gen = _colocated_gen(setup, *steps)
        lo, hi = (a, hi) if gen < c128["gen"] else (lo, a)
    asyn = Pipeline("fully_async", 128, 64, max_staleness=None, partial=True, order="completion",
                    buffer_batches=1 + v["staleness_threshold"], cap_mode="per_version",
                    train_chunks=v["trigger_parameter_sync_step"])
    notes = {"lengths": f"lognormal median {median}, sigma {sigma}, cap {v['max_response']}: mean {mean:.0f}",
             "decode_step_s": f"a + c*live per TP{v['gen_tp']} engine; c = {per_seq * 1e3:.4f} ms from "
                              f"H20 peak (GEMM at {mfu} MFU + KV reads at mean context {ctx:.0f}); "
                              f"a = {a * 1e3:.3f} ms fitted so the colocated gen is {c128['gen']} s",
             "trainer": "update at 64 GPUs from the 64-GPU colocate row, at 128 from the 128-GPU row; "
                        "old_log_prob only colocated (async uses rollout log-probs); the 128 row's remainder "
                        f"({setup.step_overhead_s:.2f} s) charged to every trainer step",
             "rollouter": "16 TP4 servers x 16 prompts in flight (max_concurrent_samples), prompt groups "
                          "held until all 16 responses end, continuous admission, partial rollout, "
                          "production capped at 1.5 batches per version, trainer streams 4 local updates "
                          "per version",
             "prompt_tokens": prompt, "sync_s": v["sync_s"]}
    return setup, colo, asyn, notes


def _colocated_gen(setup: Setup, warmup: int, steps: int) -> float:
    """Mean colocated generation seconds per batch at 128 GPUs (each engine's share of the batch,
    dealt round robin, all of it admitted at the start: the closed form of ``Simulation`` there)."""
    sim = Simulation(setup, Pipeline("colocated", 128, 0), steps, warmup)
    n_eng, total = len(sim.engines), 0.0
    for b in range(warmup, warmup + steps):
        gids = range(b * setup.prompts_per_step, (b + 1) * setup.prompts_per_step)
        worst = 0.0
        for e in range(n_eng):
            lens = sorted((n for g in gids[e::n_eng] for n in sim._group_lengths(g)), reverse=True)
            t, prev = 0.0, 0
            for live in range(len(lens), 0, -1):  # live sequences while the shortest remaining runs out
                n = lens[live - 1]
                t += (n - prev) * interp(setup.decode_table, live)
                prev = n
            worst = max(worst, t)
        total += worst
    return total / steps


def check_verl(median: float = 1500, sigma: float = 1.0) -> dict:
    """Predicted colocated/async step ratio for verl's 64:64 run against the published 2.35."""
    setup, colo, asyn, notes = verl_setup(median, sigma)
    c, a = simulate(setup, colo), simulate(setup, asyn)
    ratio = c["step_time_s"] / a["step_time_s"]
    return {"colocated": c, "fully_async": a, "predicted_ratio": ratio,
            "published_ratio": VERL["published_ratio_400_steps"],
            "error": ratio / VERL["published_ratio_400_steps"] - 1, "assumptions": notes}


# ---------------------------------------------------------------- Graft's inputs from its own results
def _geometric_lengths(mean: float, cap: int, n: int = 1000) -> list:
    """n quantiles of min(Geometric(p), cap) with p fitted so the mean is ``mean`` (a fixed EOS chance)."""
    lo, hi = 1e-6, 1.0
    for _ in range(60):
        p = (lo + hi) / 2
        lo, hi = (lo, p) if (1 - (1 - p) ** cap) / p < mean else (p, hi)
    return [min(cap, max(1, math.ceil(math.log(1 - (i + 0.5) / n) / math.log(1 - p)))) for i in range(n)]


def make_inputs(results: Path) -> dict:
    """Build inputs_1p1b.json and inputs_8b.json from bench/results (H200 runs; H100 rule stated)."""
    prof = json.loads((results / "rollout_profile_fused.json").read_text())
    row = json.loads((results / "rl_throughput_default.json").read_text())["rows"][0]
    exp1 = json.loads((results / "export_fp32_to_bf16.json").read_text())
    exp2 = json.loads((results / "export_fp32_to_bf16_2gpu.json").read_text())
    gb1 = row["parameters"] * 2 / 1e9
    h100_extra = gb1 / 3350 - gb1 / 4800  # the weights' read at H100's 3.35 TB/s instead of H200's 4.8
    rep = prof["replay_ms"]
    sizes = sorted({int(key.split("/")[0]) for key in rep})
    table = [[b, round((rep[f"{b}/64"] + rep[f"{b}/320"]) / 2e3 + h100_extra, 7)] for b in sizes]
    n = 256
    mean = row["response_length"]
    broadcast = exp2["all_gather_gb_per_s"]
    base = {
        "decode_table": table, "lengths": _geometric_lengths(mean, 256),
        "update_tokens_per_s_per_gpu": [[1, row["update_tokens_per_s"]]], "weight_gb": round(gb1, 4),
        "prompts_per_step": 32, "prompts_per_gpu": 32, "group_size": 8,
        "prompt_tokens": round(row["tokens_per_step"] / n - mean, 3), "gpus_per_engine": 1,
        "max_seqs_per_engine": 256, "continuous": False, "logprob_pass_fraction": round(14380 / 9883 - 1, 4),
        "step_overhead_s": round(row["step_s"] - row["rollout_s"] - row["update_s"], 4),
        "sync_colocated_gb_per_s": exp1["rows"][0]["gb_per_s"],
        "sync_intra_node_gb_per_s": round(1 / (1 / exp2["rows"][0]["gb_per_s"] + 1 / broadcast), 1),
        "sync_inter_node_gb_per_s": round(1 / (1 / exp2["rows"][0]["gb_per_s"] + 1 / 45.0), 1),
        "sync_latency_s": 0.05, "gpus_per_node": 8}
    base["source"] = {
        "decode_table": "rollout_profile_fused.json replay_ms (H200, fused graphed decode, TinyLlama "
                        "shapes): mean of the 64- and 320-slot columns per batch, + the weights' extra read "
                        f"time on an H100 ({h100_extra * 1e3:.3f} ms: {gb1:.2f} GB at 3.35 vs 4.8 TB/s); "
                        "the step is launch-bound (bench/README), so nothing else is scaled",
        "lengths": f"no per-sample list was saved: min(geometric, 256) with p fitted to the measured mean "
                   f"{mean:.2f} (rl_throughput_default.json; random-init model, fixed EOS chance), "
                   "1000 quantiles",
        "update_tokens_per_s_per_gpu": "rl_throughput_default.json update_tokens_per_s (1 H200; H100 has "
                                       "the same bf16 peak; assumed flat in the GPU count: not measured "
                                       "beyond 1)",
        "weight_gb": f"{row['parameters']} parameters x 2 bytes (bf16 export)",
        "prompts_per_step": "32 prompts x 8 samples per GPU (the measured one-GPU step); scaled with G",
        "prompt_tokens": "rl_throughput_default.json tokens_per_step / 256 - response_length",
        "logprob_pass_fraction": "bench/README issue 11/16 table: update 9,883 tok/s with the old-log-prob "
                                 "pass vs 14,380 without",
        "step_overhead_s": "rl_throughput_default.json step_s - rollout_s - update_s",
        "sync": "colocated: export_fp32_to_bf16.json device sink (1 GPU); one node: 2-GPU export in series "
                "with a broadcast at the 2-GPU all-gather rate; across nodes: 2-GPU export in series with "
                "an assumed 45 GB/s broadcast (400 Gb/s InfiniBand); latency 0.05 s assumed",
        "not_modelled": "prefill, reward time beyond step_overhead_s, FSDP scaling loss past 1 GPU"}
    r = 8.03e9 / row["parameters"]
    big = dict(base, weight_gb=round(gb1 * r, 3),
               decode_table=[[b, round(t + (r - 1) * gb1 / 3350 + (r - 1) * (t - table[0][1]), 7)]
                             for b, t in table],
               update_tokens_per_s_per_gpu=[[1, round(row["update_tokens_per_s"] / r, 1)]])
    big["source"] = dict(base["source"], scaling=(
        f"Llama-3-8B shape (8.03e9 parameters, x{r:.2f} the bench model, whose 128-token vocabulary makes "
        "it 0.97e9; x7.3 against TinyLlama's 1.1e9). weight_gb x r. decode: t8(b) = t(b) + (r-1) x weight "
        "read at 3.35 TB/s (memory bound) + (r-1) x (t(b) - t(8)) (the batch-dependent GEMM and KV work "
        "grows with the model). update tokens/s / r (FLOPs bound at the same MFU). Lengths, prompts, "
        "group kept."))
    out = {"inputs_1p1b.json": base, "inputs_8b.json": big}
    RESULTS.mkdir(parents=True, exist_ok=True)
    for name, data in out.items():
        (RESULTS / name).write_text(json.dumps(data, indent=1) + "\n")
    return out


def predictions(k: int = 4) -> dict:
    """The grid written to predictions.json: 8, 64, 256 H100s x the 1.1B and 8B inputs."""
    out = {}
    for name in ("inputs_1p1b.json", "inputs_8b.json"):
        for gpus in (8, 64, 256):
            out[f"{name[7:-5]}/{gpus}"] = predict(load_setup(RESULTS / name, gpus), gpus, k)
    return out


# ---------------------------------------------------------------- measured runs
def _rows(path: Path, first: int = 2, last: int | None = None) -> list:
    """The step rows of a metrics.jsonl with ``first <= step <= last``."""
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [r for r in rows if "step_time_s" in r and first <= r["step"] <= (last or r["step"])]


def _mean(rows: list, key: str) -> float:
    return statistics.fmean(r.get(key, 0.0) for r in rows)


def _metrics_files(base: Path, pattern: str) -> list:
    """The metrics.jsonl files a spec or a run folder names: a path, or a glob (one per round)."""
    files = sorted(base.glob(pattern))
    if not files:
        raise FileNotFoundError(f"no metrics file matches {base / pattern}")
    return files


def measured_step_times(spec: dict, base: Path) -> dict:
    """Mean step_time_s per mode: given, or from metrics.jsonl files (a path or a glob: every round's
    steps after ``skip_steps``, default 1, up to ``last_step``, default the last)."""
    out = {}
    for mode, m in spec["modes"].items():
        if "step_time_s" in m:
            out[mode] = [float(m["step_time_s"])]
        else:
            out[mode] = [_mean(_rows(f, m.get("skip_steps", 1) + 1, m.get("last_step")), "step_time_s")
                         for f in _metrics_files(base, m["metrics"])]
    return out


def compare_measured(spec: dict, base: Path, steps: int = 4, warmup: int = 2) -> dict:
    """Predicted vs measured step time per mode (the mean over the rounds; each round's mean too).
    spec: {"inputs": FILE, "gpus": N, "modes": {name: {"kind", "gpus", "rollout_gpus", "max_staleness",
    "partial", "recompute", "step_time_s" | "metrics" [, "skip_steps", "last_step"]}} [, "steps",
    "warmup"]} (simulated steps)."""
    setup = load_setup(base / spec["inputs"])
    steps, warmup = spec.get("steps", steps), spec.get("warmup", warmup)
    meas, out = measured_step_times(spec, base), {}
    for mode, m in spec["modes"].items():
        pipe = preset(m.get("kind", mode), m.get("gpus", spec["gpus"]), m.get("rollout_gpus", 0),
                      m.get("max_staleness", 4), m.get("partial", False), m.get("recompute", True))
        pred, mean = simulate(setup, pipe, steps, warmup), statistics.fmean(meas[mode])
        out[mode] = {"predicted_step_time_s": pred["step_time_s"], "measured_step_time_s": mean,
                     "error": pred["step_time_s"] / mean - 1, "measured_rounds_s": meas[mode],
                     "predicted_trainer_idle_share": pred["trainer_idle_share"]}
    return out


def cpu_inputs(runs: Path, cores: float = 2.0, n: int = 8, ranks: int = 2, first: int = 3,
               last: int = 23) -> dict:
    """inputs_cpu.json from ``graft train`` runs on CPU (``run_cpu``), saved as
    ``runs/<round>/<name>/metrics.jsonl`` (or ``runs/<name>/``): colocated on ``ranks`` ranks at 8, 16
    and 32 prompts per step (``colo8``, ``colo16``, ``colo32``), ``colo16_always`` (old log-probs
    recomputed), and ``k0`` (graft-async-rl, 1 worker, on-policy: the weight sync). Every mean is
    over the steps ``first..last`` of every round."""
    def rows(name: str) -> list:
        pattern = f"{name}/metrics.jsonl" if (runs / name).is_dir() else f"*/{name}/metrics.jsonl"
        return [r for f in _metrics_files(runs, pattern) for r in _rows(f, first, last)]

    colo = {p: rows(f"colo{p}") for p in (8, 16, 32)}
    base, always, k0 = colo[16], rows("colo16_always"), rows("k0")
    trunc, mean_len = _mean(base, "response_truncated_fraction"), _mean(base, "response_length")
    cap, short = int(round(_mean(base, "response_length_max"))), round(200 * (1 - trunc))
    lengths = [cap] * (200 - short) + [1 + i * (cap - 2) // max(short - 1, 1) for i in range(short)]
    loads = {str(f.parent.relative_to(runs)): round(cpu_window(f.parent, first, last)["other_cores"], 2)
             for f in sorted(runs.glob("**/cpu.json"))}
    data = {
        "decode_table": [[p * n // ranks, round(_mean(r, "rollout_s") / _mean(r, "response_length_max"), 6)]
                         for p, r in colo.items()],
        "lengths": lengths, "prompt_tokens": round(_mean(base, "prompt_length"), 3),
        "update_tokens_per_s_per_gpu": [[ranks, round(_mean(base, "tokens") / _mean(base, "update_s") / ranks,
                                                      1)]],
        "logprob_pass_fraction": round(_mean(always, "update_s") / _mean(base, "update_s") - 1, 4),
        "step_overhead_s": round(_mean(base, "step_time_s") - _mean(base, "rollout_s")
                                 - _mean(base, "update_s"), 4),
        "weight_gb": round(_mean(k0, "async_rl/weight_sync_gb"), 6), "prompts_per_step": 16,
        "sync_intra_node_gb_per_s": round(_mean(k0, "async_rl/weight_sync_gb") / _mean(k0, "weight_sync_s"),
                                          5),
        "group_size": n, "max_seqs_per_engine": 16 * n, "continuous": False, "gpus_per_engine": 1,
        "cpu_cores": cores}
    data["source"] = {
        "runs": f"python3 bench/async_sim_inputs.py --run: graft train on this {cores:g}-core CPU, tiny "
                "default preset, gloo, embedded engine, 24 steps, rollout.seeded_sampling=true, every "
                f"rank one thread (torchrun's OMP_NUM_THREADS=1); every mean over steps {first}-{last} of "
                f"each round ({runs.name}/<round>/<run>/metrics.jsonl, each rank's CPU time in cpu.json)",
        "other_cores": "cores used by other work on the machine during each run's steps "
                       f"{first}-{last} (/proc/stat busy less the run's processes): {loads}",
        "decode_table": f"colo8/16/32: mean rollout_s / mean response_length_max per step, at prompts x {n} "
                        f"/ {ranks} sequences per rank (the 'engine', with the other rank generating too): "
                        "prefill and sampling included, reward not",
        "lengths": f"colo16: {trunc:.1%} of responses truncated at {cap} (response_truncated_fraction), "
                   f"the rest spread evenly over 1..{cap - 1}; measured mean {mean_len:.2f}",
        "update_tokens_per_s_per_gpu": "colo16: tokens / update_s per rank (2 ranks, 1 core each)",
        "logprob_pass_fraction": "colo16_always update_s / colo16 update_s - 1",
        "step_overhead_s": "colo16: step_time_s - rollout_s - update_s",
        "sync": "k0: async_rl/weight_sync_gb / weight_sync_s (gather + gloo broadcast of a tiny model: "
                "latency-bound, as a rate), the trainers syncing while the worker waits for the weights "
                "(nothing else busy); colocated: none (weight_sync_s is 0: the engine shares the weights)",
        "cpu_cores": "the ranks share the cores: a busy one (generating, updating, syncing) runs at "
                     "min(1, cores / busy ranks), a waiting one uses none: in every round a rank's CPU "
                     "time (cpu.json) is its busy time (k0's worker, generating ~25% of a step, used "
                     "~0.25 cores), not its wall time"}
    return data


# ---------------------------------------------------------------- the CPU runs, with each rank's CPU time
ASYNC = ["features.async_rl.workers=1"]
CPU_RUNS = {"colo8": (2, ["rollout.prompts_per_step=8"]), "colo16": (2, []),
            "colo32": (2, ["rollout.prompts_per_step=32"]),
            "colo16_always": (2, ["algorithm.old_logprobs=always"]),
            **{f"k{k}": (3, [*ASYNC, f"features.async_rl.max_staleness={k}"]) for k in (0, 1, 4)}}
CPU_COMMON = ["checkpoint.every_steps=0", "checkpoint.save_at_end=false", "export.hf_at_end=false",
              "rollout.seeded_sampling=true", "trainer.total_steps=24"]


def _proc_ticks(marker: str) -> tuple:
    """({rank: CPU ticks}, CPU ticks of the run's other processes) of the processes whose environment
    holds ``GRAFT_ASYNC_SIM=marker``, and the machine's busy ticks (/proc/stat, idle and iowait out)."""
    ranks, rest = {}, 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = dict(e.split(b"=", 1) for e in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                       if b"=" in e)
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if env.get(b"GRAFT_ASYNC_SIM") == marker.encode():
            ticks = int(stat[11]) + int(stat[12])
            if b"LOCAL_RANK" in env:
                ranks[int(env[b"RANK"])] = ticks
            else:
                rest += ticks
    cpu = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    return ranks, rest, sum(cpu) - cpu[3] - cpu[4]


def run_cpu(out: Path, name: str) -> Path:
    """One ``graft train`` of ``CPU_RUNS[name]`` into ``out/name`` (metrics.jsonl), with cpu.json: at
    each step's end (a metrics line), the wall time, each rank's CPU seconds, the CPU seconds of
    the launcher and of the whole machine (the rest is other work sharing the cores)."""
    nproc, over = CPU_RUNS[name]
    run = out / name
    shutil.rmtree(run, ignore_errors=True)  # a run folder is resumed, and its metrics appended to
    out.mkdir(parents=True, exist_ok=True)
    marker = str(run.resolve())
    env = dict(os.environ, GRAFT_ASYNC_SIM=marker)
    cmd = ["graft", "train", "--nproc", str(nproc), f"trainer.run_dir={marker}", *CPU_COMMON, *over]
    log = out / f"{name}.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT)
        marks, seen, hz = [], -1, os.sysconf("SC_CLK_TCK")
        while proc.poll() is None:
            metrics = run / "metrics.jsonl"
            lines = metrics.read_text().count("\n") if metrics.exists() else 0
            if lines != seen:
                seen, (ranks, rest, busy) = lines, _proc_ticks(marker)
                marks.append({"t": time.perf_counter(), "steps": lines,
                              "ranks": {r: v / hz for r, v in ranks.items()},
                              "launcher": (rest + sum(os.times()[:2]) * hz) / hz, "machine": busy / hz})
            time.sleep(0.02)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}); see {log}")
    (run / "cpu.json").write_text(json.dumps({"command": " ".join(cmd), "marks": marks}) + "\n")
    log.unlink()
    for path in run.iterdir():  # the samples, config and exports: not kept with the results
        if path.name not in ("metrics.jsonl", "cpu.json"):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    return run


def cpu_window(run: Path, first: int, last: int) -> dict:
    """Cores used between the end of step ``first - 1`` and the end of step ``last``: each rank's,
    and the others' (the machine's busy time less the run's)."""
    marks = json.loads((run / "cpu.json").read_text())["marks"]
    a = next(m for m in marks if m["steps"] >= first - 1)
    b = next(m for m in marks if m["steps"] >= last)
    wall = b["t"] - a["t"]
    ranks = {r: (b["ranks"][r] - a["ranks"][r]) / wall for r in sorted(a["ranks"])}
    run_s = sum(b["ranks"].values()) - sum(a["ranks"].values()) + b["launcher"] - a["launcher"]
    return {"wall_s": wall, "rank_cores": ranks, "other_cores": (b["machine"] - a["machine"] - run_s) / wall}


def run_rounds(out: Path, names: list, rounds: int = 3, max_other: float = 0.15, tries: int = 4) -> None:
    """``rounds`` rounds of the named runs into ``out/r<i>/``, each run repeated (up to ``tries``)
    while other work used more than ``max_other`` cores during its steps 3-23."""
    for i in range(1, rounds + 1):
        for name in names:
            for _ in range(tries):
                window = cpu_window(run_cpu(out / f"r{i}", name), 3, 23)
                print(f"r{i}/{name}: {window['wall_s'] / 21:.3f} s a step, other work "
                      f"{window['other_cores']:.2f} cores", flush=True)
                if window["other_cores"] <= max_other:
                    break


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="Write inputs_cpu.json from CPU runs (see cpu_inputs).")
    ap.add_argument("--cpu-inputs", type=Path, default=RESULTS / "cpu", help="folder of the runs' metrics")
    ap.add_argument("--run", nargs="*", metavar="NAME", help=f"first run these of {', '.join(CPU_RUNS)} "
                    "(none named: all) into the folder's r1, r2, ..., each with its CPU time (cpu.json)")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    if a.run is not None:
        a.cpu_inputs.mkdir(parents=True, exist_ok=True)
        run_rounds(a.cpu_inputs, a.run or list(CPU_RUNS), a.rounds)
    (RESULTS / "inputs_cpu.json").write_text(json.dumps(cpu_inputs(a.cpu_inputs), indent=1) + "\n")
    print((RESULTS / "inputs_cpu.json").read_text())
