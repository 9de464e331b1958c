"""Does a checkpoint save (or a validation) slow the next rollout down, and why?

Runs the RL loop in this process on one GPU with a Qwen3-MoE shape (about 1.5B parameters, 64
experts, top-8) twice: without checkpoints, then with a checkpoint every ``--every`` steps (and
with ``--val-every``, a validation of short prompts at ``val.max_new_tokens=--val-new-tokens`` on
the same cadence, as a run with both has them after the same steps). Per step it records the
rollout's seconds, the decode graphs captured, torch.compile's compiled frames, the CUDA
allocator's retries and cudaMalloc/cudaFree counts, and the reserved memory, so a slow step after
a save can be traced to what the save (or the validation) threw away.

    python3 bench/gpu/checkpoint_rollout_check.py --out $OUT/checkpoint_rollout.json
    python3 bench/gpu/checkpoint_rollout_check.py --val-every 3 --out $OUT/with_validation.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
from typing import Any

import torch

from graft.config import compose
from graft.training.trainer import Trainer
from graft_graphed_decode.decoder import GraphedDecoder

SHAPES = {"hidden_size": 1024, "num_hidden_layers": 16, "num_attention_heads": 16,
          "num_key_value_heads": 4, "head_dim": 64, "num_local_experts": 64, "num_experts_per_tok": 8,
          "moe_intermediate_size": 512, "intermediate_size": 2048}

_captures = 0
_original_capture = GraphedDecoder._capture


def _counting_capture(self: GraphedDecoder, *args: Any, **kwargs: Any) -> Any:
    global _captures
    _captures += 1
    return _original_capture(self, *args, **kwargs)


def _counters() -> dict[str, float]:
    from torch._dynamo.utils import counters

    stats = torch.cuda.memory_stats()
    return {"captures": _captures, "compiled_frames": sum(counters["frames"].values()),
            "alloc_retries": stats.get("num_alloc_retries", 0),
            "cuda_mallocs": stats.get("num_device_alloc", 0),
            "cuda_frees": stats.get("num_device_free", 0),
            "reserved_gib": torch.cuda.memory_reserved() / 2**30}


def validation_settings(args: argparse.Namespace, run_dir: str) -> list[str]:
    """A held-out file of short prompts validated every ``--val-every`` steps (none at 0)."""
    if not args.val_every:
        return ["trainer.val_every_steps=0"]
    path = f"{run_dir}/val.jsonl"
    with open(path, "w") as handle:
        for i in range(args.val_prompts):
            handle.write(json.dumps({"prompt": f"a b {i}", "answer": "ab"}) + "\n")
    return [f"data.val_path={path}", f"trainer.val_every_steps={args.val_every}",
            f"val.max_new_tokens={args.val_new_tokens}"]


def run(args: argparse.Namespace, every: int) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(dir=args.tmp) as run_dir:
        cfg = compose([*validation_settings(args, run_dir), f"trainer.run_dir={run_dir}",
                       f"trainer.total_steps={args.steps}",
                       "model.preset=tiny-qwen3-moe", "engine.device=cuda",
                       f"rollout.prompts_per_step={args.prompts}", f"rollout.n={args.n}",
                       f"rollout.max_new_tokens={args.max_new_tokens}", "optim.lr=1e-6",
                       f"checkpoint.every_steps={every}", "checkpoint.save_at_end=false",
                       "export.hf_at_end=false",
                       *[f"+model.overrides.{k}={v}" for k, v in SHAPES.items()]])
        trainer = Trainer(cfg)
        before = _counters()
        try:
            while trainer.step < args.steps:
                metrics = trainer.train_step()  # validation, when due, in its after_step
                after_step = _counters()
                saved = trainer.checkpoints.should_save(trainer.step, args.steps)
                if saved:
                    trainer.save_checkpoint()
                after_save = _counters()
                rows.append({"step": trainer.step, "rollout_s": metrics["rollout_s"],
                             "update_s": metrics["update_s"], "saved_after": saved,
                             **{f"step_{k}": after_step[k] - before[k] for k in after_step
                                if k != "reserved_gib"},
                             **{f"save_{k}": after_save[k] - after_step[k] for k in after_save
                                if k != "reserved_gib"},
                             "reserved_gib_after_save": after_save["reserved_gib"]})
                print(json.dumps(rows[-1]), flush=True)
                before = after_save
        finally:
            trainer.job.close()
            trainer.checkpoints.wait()
        del trainer
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--every", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--val-every", type=int, default=0)
    parser.add_argument("--val-prompts", type=int, default=64)
    parser.add_argument("--val-new-tokens", type=int, default=128)
    parser.add_argument("--no-baseline", action="store_true", help="skip the run without saves")
    parser.add_argument("--tmp", default=None, help="where the run directories go")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    GraphedDecoder._capture = _counting_capture
    import graft

    result = {"shapes": SHAPES, "args": vars(args), "graft": graft.__file__,
              "device": torch.cuda.get_device_name()}
    if not args.no_baseline:
        result["without_checkpoints"] = run(args, 0)
    result[f"checkpoint_every_{args.every}"] = run(args, args.every)
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=1)


if __name__ == "__main__":
    main()
