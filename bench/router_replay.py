"""Routing replay (graft-router-replay) on one GPU: its cost, and what R3 does to the mismatch.

(a) overhead: forward + backward of one 8192-token micro-batch (8 samples of 1024 tokens) through
    Graft's engine on a Qwen3-30B-A3B-shaped MoE with 4 layers (hidden 2048, 32 heads / 4 KV of
    128, 128 experts, top-8, moe_intermediate 768; the built-in 128-token vocabulary), FSDP2 on
    one GPU, bf16 compute with fp32 masters. Native routing (no replay hooks on the model)
    against R2 replay (routes recorded by an old-log-prob pass of the same weights, replayed in
    the update pass: int16 targets, per-row native fallback, weights recomputed from the
    router's logits, mismatch counters). Rounds alternate native / replay; each round times
    ``--steps`` passes after a warm-up pass. The record pass (no grad) is timed the same way
    against a plain no-grad pass.
(b) RL: the embedded engine on a ~0.83B Qwen3-MoE (hidden 1024, 8 layers, 64 experts, top-8,
    moe_intermediate 512), bf16 compute, ``--rl-steps`` steps of ``algorithm.mini_batches=2``
    (so the old log-probs are recomputed and ``train_infer_logprob_diff`` compares them with the
    rollout's), R3 against disabled, same seed. ``router_replay/mismatch_fraction`` (R3) is the
    share of the trainer's own top-k choices that differ from the rollout's: the routing
    disagreement that the disabled run trains with.

    python bench/router_replay.py --out $OUT/router_replay.json      # one GPU, ~2 minutes
    python bench/router_replay.py --small                             # CPU smoke test, seconds
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from functools import partial
from statistics import mean, median
from typing import Any

import torch
from timing import timed

from graft.config import compose
from graft.engine.batch.micro_batch import TokenSample, build_micro_batch
from graft.engine.distributed.env import init_distributed, shutdown_distributed
from graft.plugins import get_plugin_manager
from graft.training.sft import sft_loss
from graft.training.trainer import Trainer, build_engine

QWEN3_30B_A3B_4L = {"hidden_size": 2048, "num_hidden_layers": 4, "num_attention_heads": 32,
                    "num_key_value_heads": 4, "head_dim": 128, "moe_intermediate_size": 768,
                    "experts": 128, "num_experts_per_tok": 8, "max_position_embeddings": 8192}
MOE_08B = {"hidden_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 16,
           "num_key_value_heads": 4, "head_dim": 64, "moe_intermediate_size": 512,
           "experts": 64, "num_experts_per_tok": 8}
SMALL = {"experts": 8, "num_experts_per_tok": 2}


def overrides(shapes: dict[str, int]) -> list[str]:
    """``model.overrides`` for a Qwen3-MoE preset; the expert-count field is named
    ``num_local_experts`` from transformers 5.19 on, ``num_experts`` before."""
    from transformers import Qwen3MoeConfig

    key = "num_local_experts" if "num_local_experts" in Qwen3MoeConfig().to_dict() else "num_experts"
    fields = {(key if name == "experts" else name): value for name, value in shapes.items()}
    return [f"+model.overrides.{name}={value}" for name, value in fields.items()]






def overhead(args: argparse.Namespace) -> dict[str, Any]:
    """(a): forward + backward with and without replay, and the record pass, same engine."""
    from graft_router_replay.routes import ROUTES, VALID
    from graft_router_replay.session import start_session, stop_session

    device_name = "cpu" if args.small else "cuda"
    shapes = SMALL if args.small else QWEN3_30B_A3B_4L
    cfg = compose(["model.preset=tiny-qwen3-moe", f"engine.device={device_name}",
                   *overrides(shapes), "engine.max_tokens_per_micro_batch=8192"])
    env = init_distributed(device_preference=device_name)
    engine = build_engine(cfg, env, pad_token_id=0)  # mode=disabled: no hooks on the routers
    generator = torch.Generator().manual_seed(0)
    length, count = (64, 4) if args.small else (1024, 8)
    samples = [TokenSample([1, *torch.randint(3, 128, (length - 1,), generator=generator).tolist()],
                           length // 4) for _ in range(count)]
    batch = [build_micro_batch(samples, packs_sequences=True, pad_token_id=0)]
    hook = get_plugin_manager().hook

    def forward_backward() -> None:
        engine.forward_backward(batch, sft_loss, loss_scale_factor=1.0, phase="update")
        engine.model.zero_grad(set_to_none=True)

    def no_grad_pass() -> None:
        engine.logprobs(batch, phase="old_logprobs")

    rounds: dict[str, list[float]] = {"native": [], "replay": [], "plain_no_grad": [],
                                      "record": []}
    metrics: dict[str, float] = {}
    seconds = partial(timed, warmup=1, steps=args.steps, device=env.device)
    for _ in range(args.rounds):
        stop_session()
        for name in (ROUTES, VALID):  # the last round's records: native passes carry none
            batch[0].tensors.pop(name, None)
        rounds["native"].append(seconds(forward_backward))
        rounds["plain_no_grad"].append(seconds(no_grad_pass))
        start_session(engine.model, "R2")
        hook.graft_step_begin(step=1)
        rounds["record"].append(seconds(no_grad_pass))  # keeps the routes
        rounds["replay"].append(seconds(forward_backward))
        hook.graft_step_end(step=1, metrics=metrics)
    stop_session()
    result = {name: median(values) for name, values in rounds.items()}
    result.update(
        tokens=length * count, shapes=shapes, rounds=rounds,
        replay_overhead=result["replay"] / result["native"] - 1,
        record_overhead=result["record"] / result["plain_no_grad"] - 1,
        params=sum(p.numel() for p in engine.model.parameters()),
        experts_implementation=getattr(engine.model.config, "_experts_implementation", None),
        peak_memory_gib=torch.cuda.max_memory_allocated() / 2**30 if env.device.type == "cuda"
        else None,
        bytes_per_token=metrics.get("router_replay/bytes_per_token"),
        mismatch_fraction=metrics.get("router_replay/mismatch_fraction"))
    return result


def rl_runs(args: argparse.Namespace) -> dict[str, Any]:
    """(b): R3 against disabled, same seed and settings."""
    device_name = "cpu" if args.small else "cuda"
    shapes = SMALL if args.small else MOE_08B
    prompts, n, new_tokens, budget = (4, 4, 8, 96) if args.small else (16, 4, 32, 1024)
    runs = {}
    for mode in ("disabled", "R3"):
        with tempfile.TemporaryDirectory() as run_dir:
            cfg = compose([
                f"trainer.run_dir={run_dir}", f"trainer.total_steps={args.rl_steps}",
                "model.preset=tiny-qwen3-moe", f"engine.device={device_name}",
                *overrides(shapes), f"rollout.prompts_per_step={prompts}", f"rollout.n={n}",
                f"rollout.max_new_tokens={new_tokens}", "algorithm.mini_batches=2",
                f"engine.max_tokens_per_micro_batch={budget}", "optim.lr=1e-5",
                "checkpoint.every_steps=0", "checkpoint.save_at_end=false",
                "export.hf_at_end=false", "trainer.log_every_steps=1",
                f"features.router_replay.mode={mode}"])
            history = Trainer(cfg).fit()
        keys = ("train_infer_logprob_diff", "router_replay/mismatch_fraction",
                "router_replay/fallback_rows", "reward_mean", "rollout_s", "update_s",
                "step_time_s")
        runs[mode] = [{"step": row["step"], **{k: row[k] for k in keys if k in row}}
                      for row in history]
        if device_name == "cuda":
            torch.cuda.empty_cache()
    return {"shapes": shapes, "prompts": prompts, "n": n, "max_new_tokens": new_tokens,
            "runs": runs,
            "mean_train_infer_logprob_diff": {m: mean(r["train_infer_logprob_diff"]
                                                      for r in rows)
                                              for m, rows in runs.items()},
            "mean_mismatch_fraction_r3": mean(r["router_replay/mismatch_fraction"]
                                              for r in runs["R3"])}


def print_tables(result: dict[str, Any]) -> None:
    a = result["overhead"]
    print(f"\n(a) {a['tokens']} tokens, {a['params'] / 1e9:.2f} B parameters "
          f"(median of {len(a['rounds']['native'])} rounds)")
    print(f"{'pass':<34}{'native s':>10}{'replay s':>10}{'overhead':>10}")
    print(f"{'forward + backward (update)':<34}{a['native']:>10.4f}{a['replay']:>10.4f}"
          f"{a['replay_overhead']:>+10.2%}")
    print(f"{'no-grad forward (R2 records)':<34}{a['plain_no_grad']:>10.4f}{a['record']:>10.4f}"
          f"{a['record_overhead']:>+10.2%}")
    b = result["rl"]
    print(f"\n(b) RL, {b['prompts']}x{b['n']} samples, {b['max_new_tokens']} new tokens")
    print(f"{'step':>4}{'diff disabled':>16}{'diff R3':>12}{'R3 mismatch':>14}{'R3 fallback':>13}")
    for off, r3 in zip(b["runs"]["disabled"], b["runs"]["R3"], strict=True):
        print(f"{off['step']:>4}{off['train_infer_logprob_diff']:>16.3e}"
              f"{r3['train_infer_logprob_diff']:>12.3e}"
              f"{r3['router_replay/mismatch_fraction']:>14.4f}"
              f"{r3['router_replay/fallback_rows']:>13.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5, help="timed passes per round")
    parser.add_argument("--rl-steps", type=int, default=5)
    parser.add_argument("--small", action="store_true", help="tiny shapes on the CPU")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    started = time.perf_counter()
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
                              "device": torch.cuda.get_device_name() if torch.cuda.is_available()
                              and not args.small else "cpu"}
    result["overhead"] = overhead(args)
    gc.collect()  # the overhead model goes before the RL runs build theirs
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    result["rl"] = rl_runs(args)
    result["seconds"] = time.perf_counter() - started
    print_tables(result)
    print(f"\ntotal {result['seconds']:.0f} s")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=2)
    shutdown_distributed()


if __name__ == "__main__":
    main()
