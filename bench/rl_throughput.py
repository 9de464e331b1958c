"""The RL loop on one GPU with the embedded engine: rollout and training tokens per second, the
update's model TFLOP/s next to an SFT step of the same model and tokens through the same engine.

A TinyLlama-1.1B-shaped dense model (random bf16 compute, fp32 masters), the synthetic pattern
task, ``--prompts`` prompts x ``--n`` samples per step, up to ``--max-new-tokens`` generated
tokens each, GRPO with token-mean, FSDP2 on one GPU. One run per ``--variants`` entry (`VARIANTS`:
default = no overrides, what `auto` picks (graft.config.auto; the only variant without
``--variants``); before = the old-log-prob pass every step and the dynamic-cache decode; skip = the on-policy
skip; static = plus the static-cache decode copy, compiled by inductor (static-cudagraphs:
Graft's own decode loop replaying the eager decode step from a CUDA graph); rows = static plus
packed rows of at most 2048 tokens; graphs-rows = static-cudagraphs plus those rows; fused-rows
= graphs-rows with the step's kernels fused by inductor, eager rounding kept (the default); exact
= graphs-rows with ``features.exact.enabled=true`` (graft-exact: batch-invariant kernels, mismatch and
exact fraction in its row, its step throughput over fused-rows' in ``exact_over_fused_rows``); flex
= static plus FlexAttention for packed rows; every variant but default pins the settings
`auto` would choose), then an SFT step through the last variant's engine on samples of the RL
batch's lengths. The first step (warm-up) is left out of the averages; each row reports its
``time_to_first_step_s`` (from the start of the process for the first variant, of its run for
the others). ``--cold-warm`` runs the default twice more, each in a fresh process with one step: with
an empty torch.compile cache folder, then with the folder the first filled. They run first, before
this process builds any model, so each has the GPU to itself (started while this process held a
1.1B run's memory, both ran out of it).

    python3 bench/rl_throughput.py --out $OUT/rl_throughput.json          # the defaults
    python3 bench/rl_throughput.py --cold-warm --out $OUT/rl_default.json
    python3 bench/rl_throughput.py --variants before fused-rows --out $OUT/rl_throughput.json
    python3 bench/rl_throughput.py --variants fused-rows exact --no-sft --out $OUT/rl_exact.json
    python3 bench/rl_throughput.py --tiny --cold-warm                     # CPU smoke test
    python3 bench/rl_throughput.py --variants fused-rows --profile-rollout $OUT/profile.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from statistics import mean, median
from typing import Any

import torch
from timing import sync

from graft.config import compose
from graft.engine.batch.micro_batch import TokenSample
from graft.training.sft import sft_loss
from graft.training.trainer import Trainer

SHAPES_1B = {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
             "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 64}


# Settings `auto` picks on CUDA; the variants that are not `default` pin them.
ONE_ROW, NO_COMPILE = "engine.max_tokens_per_row=0", "engine.compile=false"
# variant -> config overrides
VARIANTS = {
    "default": [],
    "before": ["algorithm.old_logprobs=always", "rollout.decode=dynamic", ONE_ROW, NO_COMPILE],
    "skip": ["algorithm.old_logprobs=auto", "rollout.decode=dynamic", ONE_ROW, NO_COMPILE],
    "static": ["algorithm.old_logprobs=auto", "rollout.decode=static",
               "rollout.decode_compile=inductor", ONE_ROW, NO_COMPILE],
    "static-cudagraphs": ["algorithm.old_logprobs=auto", "rollout.decode=static",
                          "rollout.decode_compile=cudagraphs",
                          "features.graphed_decode.fuse_kernels=false", ONE_ROW, NO_COMPILE],
    "rows": ["algorithm.old_logprobs=auto", "rollout.decode=static",
             "rollout.decode_compile=inductor", "engine.max_tokens_per_row=2048", NO_COMPILE],
    "graphs-rows": ["algorithm.old_logprobs=auto", "rollout.decode=static",
                    "rollout.decode_compile=cudagraphs",
                    "features.graphed_decode.fuse_kernels=false",
                    "engine.max_tokens_per_row=2048", NO_COMPILE],
    "fused-rows": ["algorithm.old_logprobs=auto", "rollout.decode=static",
                   "rollout.decode_compile=cudagraphs",
                   "features.graphed_decode.fuse_kernels=true",
                   "engine.max_tokens_per_row=2048", NO_COMPILE],
    # fused-rows with graft-exact: the batch-invariant kernels on both sides (graft_exact;
    # no fused decode kernels), the mismatch exactly 0 on every step
    "exact": ["algorithm.old_logprobs=auto", "rollout.decode=static",
              "rollout.decode_compile=cudagraphs", "features.graphed_decode.fuse_kernels=false",
              "engine.max_tokens_per_row=2048", NO_COMPILE, "features.exact.enabled=true"],
    "flex": ["algorithm.old_logprobs=auto", "rollout.decode=static",
             "rollout.decode_compile=inductor",
             "model.attn_implementation=flex_attention", ONE_ROW, NO_COMPILE],
}


def config(args: argparse.Namespace, run_dir: str, variant: str) -> Any:
    shapes = {} if args.tiny else SHAPES_1B
    return compose([
        f"trainer.run_dir={run_dir}", f"trainer.total_steps={args.steps}",
        "model.preset=tiny-llama", f"engine.device={'cpu' if args.tiny else 'cuda'}",
        f"rollout.prompts_per_step={args.prompts}", f"rollout.n={args.n}",
        f"rollout.max_new_tokens={args.max_new_tokens}", "optim.lr=1e-6", *VARIANTS[variant],
        f"engine.max_tokens_per_micro_batch={args.micro_batch_tokens}",
        "checkpoint.every_steps=0", "checkpoint.save_at_end=false", "export.hf_at_end=false",
        *[f"+model.overrides.{k}={v}" for k, v in shapes.items()], *args.override])


def parameters(trainer: Trainer) -> int:
    """Parameters of the (sharded) model, counted globally."""
    return sum(p.numel() for p in trainer.engine.model.parameters())




def sft_step_seconds(trainer: Trainer, lengths: list[int], prompt: int, repeats: int) -> float:
    """Median seconds of a forward/backward + AdamW step on samples of ``lengths`` tokens."""
    engine = trainer.engine
    generator = torch.Generator().manual_seed(0)
    samples = [TokenSample(torch.randint(3, 100, (n,), generator=generator).tolist(), prompt)
               for n in lengths]
    scale = float(trainer.cfg.rollout.max_new_tokens)
    times = []
    for _ in range(repeats + 1):  # the first is warm-up
        sync(engine.env.device)
        started = time.perf_counter()
        batches = engine.micro_batches(samples)
        pending = engine.forward_backward(batches, sft_loss, loss_scale_factor=scale, phase="sft")
        engine.optimizer_step()
        pending.result()
        sync(engine.env.device)
        times.append(time.perf_counter() - started)
    return sorted(times[1:])[len(times[1:]) // 2]


def rl_row(args: argparse.Namespace, variant: str, *, profile: dict[str, Any] | None = None,
           waited_s: float = 0.0) -> tuple[dict[str, Any], Trainer]:
    """One variant's RL run; with ``profile`` (a dict), one more rollout after the last step is
    profiled into it (`rollout_profile.py`) before the run stops its rollout engine.
    ``waited_s``: seconds this process spent before the run waiting for others (the
    ``--cold-warm`` processes), left out of a time to first step counted from its start."""
    with tempfile.TemporaryDirectory() as run_dir:
        cfg = config(args, run_dir, variant)
        trainer = Trainer(cfg)
        if profile is not None:
            from rollout_profile import profile_rollout

            close = trainer.job.close
            trainer.job.close = lambda: (profile.update(profile_rollout(trainer)), close())
        history = trainer.fit()
    steady = history[1:] or history
    params = parameters(trainer)
    tokens = mean(r["tokens"] for r in steady)
    update_s = mean(r["update_s"] for r in steady)
    # forward + backward = 6 N per token; an old-log-prob pass adds a forward, 2 N per token
    # one update per step (ppo_epochs = mini_batches = 1): "auto" skips the old-log-prob pass
    flops_per_token = (6 + (2 if cfg.algorithm.old_logprobs == "always" else 0)) * params
    first = next(r for r in history if "time_to_first_step_s" in r)
    return {"variant": variant, "overrides": VARIANTS[variant],
            "auto": [str(choice) for choice in trainer.auto_choices], "parameters": params,
            "time_to_first_step_s": round(first["time_to_first_step_s"] - waited_s, 1),
            "compile_cache_hits": first.get("compile_cache_hits", 0),
            "compile_cache_misses": first.get("compile_cache_misses", 0),
            "tokens_per_step": round(tokens),
            "rollout_tokens_per_s": round(mean(r["rollout_tokens_per_s"] for r in steady)),
            "update_tokens_per_s": round(tokens / update_s),
            "update_model_tflops": round(flops_per_token * tokens / update_s / 1e12, 1),
            "response_length": mean(r["response_length"] for r in steady),
            "rollout_s": mean(r["rollout_s"] for r in steady), "update_s": update_s,
            "step_s": mean(r["step_time_s"] for r in steady),
            # each step's, the warm-up included: a first use of a kernel (a Triton compile, a
            # graph capture) in a later step shows as one slow step
            "rollout_s_per_step": [round(r["rollout_s"], 4) for r in history],
            "update_s_per_step": [round(r["update_s"], 4) for r in history],
            "step_s_per_step": [round(r["step_time_s"], 4) for r in history],
            "tokens_per_step_each": [r["tokens"] for r in history],
            "train_infer_logprob_diff": mean(r["train_infer_logprob_diff"] for r in steady),
            # every step, the warm-up included (graft-exact: 0.0 and 1.0 on each)
            "train_infer_logprob_diff_per_step": [r["train_infer_logprob_diff"] for r in history],
            "train_infer_logprob_exact_fraction_per_step": [
                r.get("train_infer_logprob_exact_fraction") for r in history],
            "peak_memory_gib": max(r["peak_memory_gib"] for r in history)}, trainer


def steady_tokens_per_s(row: dict[str, Any]) -> float:
    """A variant's tokens over its seconds, the warm-up step left out."""
    return sum(row["tokens_per_step_each"][1:]) / sum(row["step_s_per_step"][1:])


def sft_row(args: argparse.Namespace, trainer: Trainer, rl: dict[str, Any]) -> dict[str, Any]:
    """An SFT step through the same engine on as many tokens, in samples of the RL lengths."""
    samples = args.prompts * args.n
    length = max(2, round(rl["tokens_per_step"] / samples))
    seconds = sft_step_seconds(trainer, [length] * samples, prompt=length // 4, repeats=3)
    tokens = length * samples
    return {"variant": "sft (same engine, model, tokens)", "tokens_per_step": tokens,
            "update_tokens_per_s": round(tokens / seconds),
            "update_model_tflops": round(6 * rl["parameters"] * tokens / seconds / 1e12, 1),
            "update_s": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--micro-batch-tokens", type=int, default=16384)
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=["default"])
    parser.add_argument("--cold-warm", action="store_true",
                        help="also run the default twice in fresh processes (one step each), "
                             "before this process builds a model: an empty compile cache "
                             "folder, then the same folder again")
    parser.add_argument("--no-sft", action="store_true", help="skip the SFT row")
    parser.add_argument("--override", nargs="*", default=[], help="more config overrides")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--out", default=None)
    parser.add_argument("--profile-rollout", default=None, metavar="PATH",
                        help="profile one more rollout of the last variant after its steps and "
                             "write the summary to PATH (rollout_profile.py)")
    args = parser.parse_args()
    # before any model of this process: the fresh processes need the GPU's memory
    started = time.perf_counter()
    cold_warm_runs = cold_warm(args) if args.cold_warm else None
    waited_s = time.perf_counter() - started
    rows, trainer, profile = [], None, {}
    for index, variant in enumerate(args.variants):
        try:
            last = variant == args.variants[-1] and args.profile_rollout
            # the first run counts from the process's start: the cold/warm runs' time left out
            row, trainer = rl_row(args, variant, profile=profile if last else None,
                                  waited_s=waited_s if index == 0 else 0.0)
        except Exception as error:  # noqa: BLE001 - one failing variant must not lose the others
            row = {"variant": variant, "error": f"{type(error).__name__}: {error}"[:500]}
        rows.append(row)
        write(args.out, {"partial": True, "rows": rows})  # what is measured survives a timeout
    measured = [r for r in rows if "error" not in r]
    result = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
              "shapes": "tiny-llama" if args.tiny else SHAPES_1B,
              "samples_per_step": args.prompts * args.n, "max_new_tokens": args.max_new_tokens,
              "rows": rows}
    if measured and not args.no_sft:
        rows.append(sft_row(args, trainer, measured[-1]))
        rl_rate = measured[-1]["update_tokens_per_s"] / rows[-1]["update_tokens_per_s"]
        result["rl_update_over_sft_tokens_per_s"] = round(rl_rate, 3)
    by_variant = {r["variant"]: r for r in measured}
    if "exact" in by_variant and "fused-rows" in by_variant:
        exact, fast = by_variant["exact"], by_variant["fused-rows"]
        result["exact_over_fused_rows"] = {
            # the steps' tokens over their seconds (the variants sample other responses, of
            # other lengths), then the mean step's time alone, then the median step's
            "step_tokens_per_s": round(steady_tokens_per_s(exact) / steady_tokens_per_s(fast), 3),
            "step_throughput": round(fast["step_s"] / exact["step_s"], 3),
            "step_throughput_median": round(median(fast["step_s_per_step"][1:])
                                            / median(exact["step_s_per_step"][1:]), 3),
            "rollout_tokens_per_s": round(exact["rollout_tokens_per_s"]
                                          / fast["rollout_tokens_per_s"], 3),
            "update_tokens_per_s": round(exact["update_tokens_per_s"]
                                         / fast["update_tokens_per_s"], 3),
            "mismatch_zero_every_step": all(
                d == 0.0 for d in exact["train_infer_logprob_diff_per_step"])}
    if cold_warm_runs is not None:
        result["cold_warm"] = cold_warm_runs
    print(f"{'variant':<36} {'update tok/s':>12} {'TFLOP/s':>8} {'rollout tok/s':>13} "
          f"{'step s':>7} {'mismatch':>9} {'1st step s':>10}")
    for row in rows:
        if "error" in row:
            print(f"{row['variant']:<36} failed: {row['error']}")
            continue
        print(f"{row['variant']:<36} {row['update_tokens_per_s']:>12,} "
              f"{row['update_model_tflops']:>8} {row.get('rollout_tokens_per_s', ''):>13} "
              f"{row.get('step_s', 0):>7.2f} {row.get('train_infer_logprob_diff', 0):>9.2g} "
              f"{row.get('time_to_first_step_s', ''):>10}")
    for run in result.get("cold_warm", []):
        print(f"time to first step, {run['cache']} compile cache (fresh process): "
              f"{run.get('time_to_first_step_s', run.get('error'))} s "
              f"(cache hits {run.get('compile_cache_hits')}, misses "
              f"{run.get('compile_cache_misses')})")
    write(args.out, result)
    if args.profile_rollout:
        write(args.profile_rollout, {"date": result["date"], "command": result["command"],
                                     "variant": args.variants[-1], **profile})


def cold_warm(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The default variant's time to first step in two fresh processes of one step each: an
    empty compile cache folder (cold), then the same folder (warm)."""
    runs = []
    with tempfile.TemporaryDirectory() as scratch:
        cache = f"{scratch}/torch_compile"
        # Python's compiled bytecode is kept between the runs, as a user's install keeps it: on
        # the GPU image a second process compiled every module from source again (4,251 calls of
        # `compile`, bench/gpu/first_step_profile.sh)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = f"{scratch}/pycache"
        for label in ("cold", "warm"):
            out = f"{scratch}/{label}.json"
            command = [sys.executable, __file__, "--variants", "default", "--steps", "1",
                       "--no-sft", "--prompts", str(args.prompts), "--n", str(args.n),
                       "--max-new-tokens", str(args.max_new_tokens),
                       "--micro-batch-tokens", str(args.micro_batch_tokens), "--out", out,
                       *(["--tiny"] if args.tiny else []), "--override",
                       f"engine.compile_cache_dir={cache}", *args.override]
            started = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True, env=env)
            run = {"cache": label, "process_s": round(time.perf_counter() - started, 1)}
            if done.returncode != 0:
                run["error"] = done.stderr[-500:]
            else:
                (row,) = json.load(open(out))["rows"]
                run.update({k: row.get(k) for k in ("time_to_first_step_s", "compile_cache_hits",
                                                    "compile_cache_misses", "error")})
            runs.append(run)
    return runs


def write(path: str | None, result: dict[str, Any]) -> None:
    if path:
        with open(path, "w") as handle:
            json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()
