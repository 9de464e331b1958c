"""The RL loop on one GPU with the embedded engine: rollout and training tokens per second.

A TinyLlama-1.1B-shaped dense model (random bf16 compute, fp32 masters), the synthetic pattern
task, ``--prompts`` prompts x ``--n`` samples per step, up to ``--max-new-tokens`` generated
tokens each (a random model rarely stops early), GRPO with token-mean, FSDP2 on one GPU. The
first step (warm-up) is left out of the averages.

    python3 bench/rl_throughput.py --out $OUT/rl_throughput.json
    python3 bench/rl_throughput.py --tiny            # CPU smoke test
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from statistics import mean

from graft.config import compose
from graft.training.trainer import Trainer

SHAPES_1B = {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
             "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 64}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    shapes = {} if args.tiny else SHAPES_1B
    with tempfile.TemporaryDirectory() as run_dir:
        cfg = compose([
            f"trainer.run_dir={run_dir}", f"trainer.total_steps={args.steps}",
            "model.preset=tiny-llama", f"engine.device={'cpu' if args.tiny else 'cuda'}",
            f"rollout.prompts_per_step={args.prompts}", f"rollout.n={args.n}",
            f"rollout.max_new_tokens={args.max_new_tokens}", "optim.lr=1e-6",
            "engine.max_tokens_per_micro_batch=16384", "checkpoint.every_steps=0",
            "checkpoint.save_at_end=false", "export.hf_at_end=false",
            *[f"+model.overrides.{k}={v}" for k, v in shapes.items()]])
        history = Trainer(cfg).fit()
    steady = history[1:] or history
    result = {
        "date": time.strftime("%Y-%m-%d"), "shapes": shapes or "tiny-llama",
        "samples_per_step": args.prompts * args.n, "max_new_tokens": args.max_new_tokens,
        "rollout_tokens_per_s": round(mean(r["rollout_tokens_per_s"] for r in steady)),
        "train_tokens_per_s": round(mean(r["tokens"] / r["update_s"] for r in steady)),
        "response_length": mean(r["response_length"] for r in steady),
        "rollout_s": mean(r["rollout_s"] for r in steady),
        "update_s": mean(r["update_s"] for r in steady),
        "step_s": mean(r["step_time_s"] for r in steady),
        "train_infer_logprob_diff": mean(r["train_infer_logprob_diff"] for r in steady),
        "peak_memory_gib": max(r["peak_memory_gib"] for r in history)}
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()
