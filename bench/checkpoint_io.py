"""Checkpoint save/load throughput (GB/s) for a ~1B model on one GPU, sync and async.

The model is TinyLlama-1.1B-shaped (hidden 2048, MLP 5632, 22 layers, 32 heads / 4 KV, vocab
32000), random weights, FSDP2 on one GPU, after one AdamW step (so the optimizer state exists):
about 13 GB of fp32 weights and Adam moments. Measured:

* ``dcp.save`` / ``dcp.load`` alone (the library floor),
* Graft's `CheckpointManager.save` (DCP + SHA-256 manifest + fsync + atomic publish) and
  ``load`` (checksum verification + DCP + hook + ``set_state_dict``),
* with ``checkpoint.async_save``: the time the training loop is blocked, and the total.

    python3 bench/checkpoint_io.py --dir /tmp/graft-ckpt-bench --out $OUT/checkpoint_io.json
    python3 bench/checkpoint_io.py --tiny --dir /tmp/ckpt-bench                 # CPU smoke test
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from functools import partial
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict

from graft.checkpoint.manager import OPTIONS, CheckpointManager
from graft.config import compose
from graft.engine.batch.micro_batch import TokenSample
from graft.engine.distributed.env import init_distributed
from graft.training.sft import sft_loss
from graft.training.trainer import build_engine

SHAPES_1B = {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
             "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 64,
             "vocab_size": 32000}
SHAPES_TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128}


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def drop_page_cache() -> bool:
    """Best effort, so loads read from disk rather than memory (needs root)."""
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def timed(fn) -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    started = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    shapes = SHAPES_TINY if args.tiny else SHAPES_1B
    device = "cpu" if args.tiny else "cuda"
    env = init_distributed(device_preference=device)
    overrides = ["model.preset=tiny-llama", f"engine.device={device}", "trainer.mode=sft",
                 f"trainer.run_dir={args.dir}", "checkpoint.keep_last=1"]
    overrides += [f"+model.overrides.{k}={v}" for k, v in shapes.items()]
    cfg = compose(overrides)
    engine = build_engine(cfg, env, pad_token_id=0)
    sample = TokenSample(list(range(3, 100)) * 5, response_start=1)
    engine.forward_backward(engine.micro_batches([sample]), sft_loss, loss_scale_factor=1.0)
    engine.optimizer_step()
    shutil.rmtree(args.dir, ignore_errors=True)
    args.dir.mkdir(parents=True)
    model, optimizer = engine.model, engine.optimizer
    rows: dict[str, float] = {}

    raw = args.dir / "raw"
    state = dict(zip(("model", "optim"), get_state_dict(model, optimizer, options=OPTIONS),
                     strict=True))
    rows["dcp_save_s"] = timed(lambda: dcp.save(state, checkpoint_id=str(raw)))
    size = folder_bytes(raw)
    rows["cold_cache"] = drop_page_cache()
    rows["dcp_load_s"] = timed(lambda: dcp.load(state, checkpoint_id=str(raw)))
    shutil.rmtree(raw)

    def graft_saves(async_save: bool, steps: list[int]) -> list[tuple[float, float]]:
        """Blocked and total seconds of consecutive saves through one manager."""
        cfg.checkpoint.async_save = async_save
        manager = CheckpointManager(args.dir, cfg.checkpoint, env)
        out = []
        for step in steps:
            save = partial(manager.save, step, model=model, optimizer=optimizer,
                           trainer_state={"scheduler": {}, "job": {}}, config_yaml="")
            blocked = timed(save)
            out.append((blocked, blocked + timed(manager.wait)))
        return out

    rows["graft_save_s"] = graft_saves(False, [1])[0][0]
    rows["graft_async_blocked_s"], rows["graft_async_total_s"] = graft_saves(True, [2])[0]
    drop_page_cache()
    manager = CheckpointManager(args.dir, cfg.checkpoint, env)
    rows["graft_load_s"] = timed(lambda: manager.load(args.dir / "checkpoints" / "step_2",
                                                      model=model, optimizer=optimizer))
    gb = size / 1e9
    result = {"date": time.strftime("%Y-%m-%d"), "checkpoint_gb": round(gb, 3),
              "params": sum(p.numel() for p in model.parameters()),
              **{k: (round(v, 3) if isinstance(v, float) else v) for k, v in rows.items()},
              **{k[:-2] + "_gb_per_s": round(gb / v, 2) for k, v in rows.items()
                 if k.endswith("_s") and isinstance(v, float) and v > 0}}
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
