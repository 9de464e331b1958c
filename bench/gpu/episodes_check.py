"""GPU check of multi-turn episodes (#29) on the default (`auto`) path: the static decode loop
replayed from CUDA graphs, its step fused by inductor, generating every turn from the episode's
whole sequence so far (each turn a longer prompt: new cache lengths, graphs captured again).

Runs of a small Llama (tiny-llama widened to hidden 512, 4 layers) on the pattern task:
``none`` (single turn); ``one-turn`` (an environment that ends after the first turn, scored by
the configured reward: must match ``none`` bit for bit); ``three-turn`` (an environment that
answers every turn with text for three turns, 64 tokens a turn) on the default path and with
``rollout.decode=dynamic``. Reported: what `auto` chose, each step's metrics (loss, grad norm,
reward, train-inference log-prob mismatch on the model's tokens, turns, tool calls, env and
rollout seconds), and whether one-turn matches none.

    python3 bench/gpu/episodes_check.py --out $OUT/episodes_check.json
    python3 bench/gpu/episodes_check.py --device cpu --steps 2   # smoke test of the script
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import graft
from graft import hookimpl
from graft.testing import registered_plugin

KEYS = ("loss", "grad_norm", "reward_mean", "entropy", "train_infer_logprob_diff",
        "response_length", "rollout/turns_mean", "rollout/tool_calls_mean", "rollout/env_s",
        "rollout/env_errors", "rollout_s", "step_time_s")
SHAPES = {"hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 4,
          "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64}


class OneTurn:
    """Ends after the first turn; the configured reward scores it."""

    def reset(self, sample):
        return None

    def step(self, action_ids, action_text):
        return None, None, True


class ThreeTurns(OneTurn):
    """Answers each turn with a line of text; the third turn ends the episode."""

    def __init__(self) -> None:
        self.turns = 0

    def step(self, action_ids, action_text):
        self.turns += 1
        return "\n<result>ok</result>\n", None, self.turns >= 3


class Environments:
    @hookimpl
    def graft_environments(self):
        return {"one-turn": OneTurn, "three-turn": ThreeTurns}


def run(folder: Path, args: argparse.Namespace, *overrides: str) -> dict[str, Any]:
    shapes = SHAPES if args.device == "cuda" else {}
    metrics = graft.train(overrides=[
        f"trainer.run_dir={folder}", f"engine.device={args.device}", "model.preset=tiny-llama",
        *[f"+model.overrides.{k}={v}" for k, v in shapes.items()],
        "rollout.prompts_per_step=16", "rollout.n=8", "rollout.max_new_tokens=64",
        "features.multiturn.max_episode_tokens=256", f"trainer.total_steps={args.steps}",
        "checkpoint.every_steps=0", "checkpoint.save_at_end=false", "export.hf_at_end=false",
        "trainer.print_sample_every_steps=0", *overrides])
    config = (folder / "config.yaml").read_text()
    resolved = [line for line in config.splitlines() if line.startswith("#   ")]
    return {"overrides": list(overrides), "auto": resolved,
            "steps": [{k: m.get(k) for k in KEYS} for m in metrics]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="episodes_check.json")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as root, registered_plugin(Environments(), "bench-envs"):
        for name, overrides in {
                "none": (), "one-turn": ("features.multiturn.environment=one-turn", "features.multiturn.max_turns=1"),
                "three-turn": ("features.multiturn.environment=three-turn",),
                "three-turn-dynamic": ("features.multiturn.environment=three-turn",
                                       "rollout.decode=dynamic")}.items():
            runs[name] = run(Path(root) / name, args, *overrides)
            print(name, json.dumps(runs[name]), flush=True)
    compared = ("loss", "grad_norm", "reward_mean", "entropy", "train_infer_logprob_diff")
    same = [{k: s[k] for k in compared} for s in runs["none"]["steps"]] == [
        {k: s[k] for k in compared} for s in runs["one-turn"]["steps"]]
    report = {"runs": runs, "one_turn_matches_none_bit_for_bit": same}
    Path(args.out).write_text(json.dumps(report, indent=2))
    print("one-turn matches none bit for bit:", same)


if __name__ == "__main__":
    main()
