"""The 1-GPU path with graft-ulysses installed at ``sp_size=1`` against the plugin not loaded:
step time of Graft's SFT update (forward + backward + AdamW step, plus the per-step hooks).

Each leg runs in its own process (``GRAFT_DISABLE_PLUGINS=ulysses`` for "without"), legs
alternate ``--rounds`` times (without, with, without, with, ...) so clock drift hits both; a
leg builds a Llama of ~1B parameters (hidden 2048, 16 layers, 16 heads, 8 KV heads, random
init, bf16 compute over fp32 masters) through `build_engine` and times ``--steps`` steps after
``--warmup``, each over micro-batches of packed rows (``--tokens`` tokens per step). The JSON
gives every leg's mean step time, the medians and the overhead in percent (target <= 0.5).

    python bench/gpu/ulysses_sp1_overhead.py --out $OUT/ulysses_sp1_overhead.json   # one H200
    python bench/gpu/ulysses_sp1_overhead.py --small --out /tmp/ulysses_sp1.json     # CPU check
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

MODEL = {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 16,
         "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
         "vocab_size": 32000, "max_position_embeddings": 8192}
SMALL = {"num_hidden_layers": 2}


def run_leg(args: argparse.Namespace) -> dict:
    """One leg in this process: build, warm up, time; the plugin's state is reported."""
    import torch

    from graft.config import compose
    from graft.engine.batch.micro_batch import TokenSample
    from graft.engine.distributed.env import init_distributed
    from graft.plugins import get_plugin_manager
    from graft.training.sft import sft_loss
    from graft.training.trainer import build_engine

    model = SMALL if args.small else MODEL
    overrides = ["model.preset=tiny-llama", "trainer.mode=sft",
                 f"engine.device={'cpu' if args.small else 'cuda'}",
                 f"engine.max_tokens_per_micro_batch={max(args.tokens // 2, 2048)}",
                 "engine.max_tokens_per_row=2048",
                 *[f"+model.overrides.{k}={v}" for k, v in model.items()]]
    loaded = "ulysses" in get_plugin_manager().records and \
        get_plugin_manager().records["ulysses"].status == "loaded"
    if loaded:
        overrides.append("features.ulysses.sp_size=1")
    cfg = compose(overrides)
    env = init_distributed(device_preference=cfg.engine.device)
    torch.manual_seed(0)
    engine = build_engine(cfg, env, pad_token_id=0)
    generator = torch.Generator().manual_seed(1)
    vocab = int(engine.model.config.vocab_size)
    samples, total = [], 0
    while total < args.tokens:
        length = int(torch.randint(256, 2048, (1,), generator=generator))
        samples.append(TokenSample(torch.randint(3, vocab, (length,), generator=generator)
                                   .tolist(), response_start=length // 4))
        total += length
    batches = engine.micro_batches(samples)
    hook = get_plugin_manager().hook

    def step(index: int) -> float:
        hook.graft_step_begin(step=index)
        pending = engine.forward_backward(batches, sft_loss, loss_scale_factor=1.0)
        engine.optimizer_step()
        loss = pending.result().loss
        metrics = {"loss": loss}
        hook.graft_step_end(step=index, metrics=metrics)
        return loss

    for index in range(args.warmup):
        step(index + 1)
    if env.device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    losses = [step(args.warmup + i + 1) for i in range(args.steps)]
    if env.device.type == "cuda":
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - started) / args.steps
    return {"plugin_loaded": loaded, "attn_implementation": engine.model.config._attn_implementation,
            "step_s": seconds, "tokens": total, "micro_batches": len(batches),
            "losses": losses, "device": torch.cuda.get_device_name() if env.device.type == "cuda"
            else "cpu"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--small", action="store_true", help="CPU, 2 layers, few tokens")
    parser.add_argument("--tokens", type=int, default=None, help="tokens per step")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--leg", choices=["with", "without"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.tokens = args.tokens or (2048 if args.small else 32768)
    args.steps = args.steps or (3 if args.small else 10)
    if args.leg:
        Path(args.out).write_text(json.dumps(run_leg(args)))
        return
    legs: dict[str, list[dict]] = {"without": [], "with": []}
    out = Path(args.out)
    for round_index in range(args.rounds):
        for leg in ("without", "with"):
            leg_out = out.with_name(f"{out.stem}.{leg}{round_index}.json")
            env = dict(os.environ)
            disabled = [p for p in env.get("GRAFT_DISABLE_PLUGINS", "").split(",") if p]
            if leg == "without":
                disabled.append("ulysses")
            env["GRAFT_DISABLE_PLUGINS"] = ",".join(disabled)
            command = [sys.executable, __file__, "--leg", leg, "--out", str(leg_out),
                       "--tokens", str(args.tokens), "--steps", str(args.steps),
                       "--warmup", str(args.warmup), *(["--small"] if args.small else [])]
            subprocess.run(command, check=True, env=env)
            legs[leg].append(json.loads(leg_out.read_text()))
            leg_out.unlink()
    assert all(not r["plugin_loaded"] for r in legs["without"]), "ulysses loaded in 'without'"
    assert all(r["plugin_loaded"] for r in legs["with"]), "ulysses not loaded in 'with'"
    assert all(r["attn_implementation"] == legs["without"][0]["attn_implementation"]
               for r in legs["with"]), "sp_size=1 changed the attention implementation"
    median = {leg: statistics.median(r["step_s"] for r in runs) for leg, runs in legs.items()}
    overhead = 100.0 * (median["with"] / median["without"] - 1.0)
    result = {"median_step_s": median, "overhead_percent": overhead,
              "target_percent": 0.5, "within_target": overhead <= 0.5,
              "same_losses": legs["with"][0]["losses"] == legs["without"][0]["losses"],
              "legs": legs, "tokens_per_step": args.tokens, "steps": args.steps}
    out.write_text(json.dumps(result, indent=2))
    print(f"step time without ulysses {median['without']:.4f} s, with sp_size=1 "
          f"{median['with']:.4f} s: {overhead:+.2f}% (losses identical: {result['same_losses']})")


if __name__ == "__main__":
    main()
