"""GPU check of validation (#25) on the default (`auto`) path: the static decode loop replayed
from CUDA graphs, its step fused by inductor.

Three short RL runs of a small Llama (tiny-llama preset widened to hidden 512, 4 layers) on the
synthetic pattern task with a held-out JSONL of 32 prompts: without validation; with greedy
validation every step (``val.temperature=0``); with sampled validation every step
(``val.temperature=1``, ``val.n=4``). Reported: what `auto` chose, the training metrics of every
step (loss, grad norm, reward, mismatch) and whether the validated runs match the plain run bit
for bit (validation runs under a forked RNG, and its batch shapes make the decode loop capture
graphs of their own, which must not change the training rollouts), the val/* metrics, and the
seconds each step took with and without validation (the graphs of the validation batch are
captured again every time: the loop keeps one cache length's states).

    python3 bench/gpu/validation_check.py --out $OUT/validation_check.json
    python3 bench/gpu/validation_check.py --device cpu --steps 2   # smoke test of the script
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import graft

KEYS = ("loss", "grad_norm", "reward_mean", "train_infer_logprob_diff", "response_length")
SHAPES = {"hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 4,
          "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64}


def held_out(path: Path, count: int) -> Path:
    path.write_text("".join(json.dumps({"prompt": f"say {'abcdefgh'[i % 8] * (1 + i % 5)}:",
                                        "answer": "abababab"}) + "\n" for i in range(count)))
    return path


def run(folder: Path, val_file: Path, args: argparse.Namespace, *overrides: str) -> dict[str, Any]:
    started = time.perf_counter()
    shapes = SHAPES if args.device == "cuda" else {}
    metrics = graft.train(overrides=[
        f"trainer.run_dir={folder}", f"engine.device={args.device}", "model.preset=tiny-llama",
        *[f"+model.overrides.{k}={v}" for k, v in shapes.items()],
        "rollout.prompts_per_step=16", "rollout.n=8", "rollout.max_new_tokens=64",
        f"trainer.total_steps={args.steps}", f"data.val_path={val_file}",
        "data.val_answer_key=answer", "checkpoint.every_steps=0", "checkpoint.save_at_end=false",
        "export.hf_at_end=false", *overrides])
    config = (folder / "config.yaml").read_text()
    return {"overrides": list(overrides), "seconds": round(time.perf_counter() - started, 1),
            "auto": [line.strip("# \n") for line in config.splitlines() if "auto (" in line],
            "steps": [{k: m[k] for k in KEYS + ("step_time_s",) if k in m} for m in metrics
                      if m["step"] > 0],
            "val": [{k: v for k, v in m.items() if k.startswith("val/") or k == "step"}
                    for m in metrics if "val/reward_mean" in m]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", default=None)
    parser.add_argument("--device", default="cuda", help="cpu: a smoke test of this script")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        val_file = held_out(root / "val.jsonl", 32)
        runs = {"plain": run(root / "plain", val_file, args, "trainer.val_every_steps=0"),
                "greedy": run(root / "greedy", val_file, args, "trainer.val_every_steps=1"),
                "sampled": run(root / "sampled", val_file, args,
                               "trainer.val_every_steps=1", "val.temperature=1.0", "val.n=4")}
    plain = [[s[k] for k in KEYS] for s in runs["plain"]["steps"]]
    for name in ("greedy", "sampled"):
        runs[name]["training_identical_to_plain"] = \
            [[s[k] for k in KEYS] for s in runs[name]["steps"]] == plain
    result = {"date": time.strftime("%Y-%m-%d"), "shapes": SHAPES, "runs": runs}
    for name, value in runs.items():
        print(f"{name:<8} {value['seconds']:>7} s  identical: "
              f"{value.get('training_identical_to_plain', '-')}  val: "
              f"{[round(v['val/reward_mean'], 4) for v in value['val']]}")
    print("auto:", runs["plain"]["auto"])
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
