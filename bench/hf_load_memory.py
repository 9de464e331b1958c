"""Peak host memory per rank when a run's model comes from a local Hugging Face directory.

Two ways, side by side, on CPU ranks (gloo): ``per-rank`` (every rank calls ``from_pretrained``
and then shards: what Graft did before) and ``sharded`` (Graft now: meta parameters, shard, rank 0
reads and broadcasts). A ~170M-parameter Llama saved in bf16, as real checkpoints are, loaded as
fp32 master weights (0.62 GB in memory; a same-dtype load can stay a view of the memory-mapped
file, shared between ranks, a dtype change cannot). Each
rank reports its peak resident memory above what it held before building the model. On CPU
ranks the shards themselves live in host memory (1/N of the model per rank); on GPUs they do not,
so there the sharded way holds one host copy (rank 0's read) for the whole node.

    python bench/hf_load_memory.py --ranks 2 4 --out bench/results/hf_load_memory.json
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHAPES = {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8,
          "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 64,
          "vocab_size": 32000}


def write_checkpoint(folder: Path) -> float:
    """A random Llama of `SHAPES` saved as a bf16 HF directory; returns its fp32 size in GB."""
    import torch

    from graft.config import ModelConfig
    from graft.data.tokenizer import load_tokenizer
    from graft.models import build_model

    model, _ = build_model(ModelConfig(preset="tiny-llama", overrides=dict(SHAPES)), seed=0)
    size = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e9
    model.to(torch.bfloat16).save_pretrained(folder)
    load_tokenizer(None, None).save_pretrained(folder)
    return size


def worker(method: str, hf_dir: str, out: str) -> None:
    """One rank: build the model ``method``'s way, then record this process's peak RSS."""
    from graft.config import compose
    from graft.engine.distributed.env import end_torchrun_worker, init_distributed
    from graft.engine.distributed.parallelize import build_parallel_model, parallelize
    from graft.models.build import build_model, build_skeleton

    env = init_distributed(device_preference="cpu")
    cfg = compose([f"model.path={hf_dir}", "engine.device=cpu"])
    build_skeleton(cfg.model)  # imports the model's modules: not part of what loading costs
    before = current_rss_gib()
    if method == "sharded":
        build_parallel_model(env, cfg=cfg)
    else:  # every rank reads the whole checkpoint, then shards it
        model, family = build_model(cfg.model)
        parallelize(model, family, cfg=cfg, mesh=env.mesh, device=env.device, meshes=env.meshes)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    Path(out, f"{method}_rank{env.rank}.json").write_text(json.dumps({"gib": peak - before}))
    end_torchrun_worker()


def current_rss_gib() -> float:
    """This process's resident memory now (``VmRSS``), GiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 2**20
    raise RuntimeError("no VmRSS in /proc/self/status")


def run(method: str, ranks: int, hf_dir: Path, out: Path) -> list[float]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={ranks}", __file__, "--worker", method, str(hf_dir), str(out)]
    subprocess.run(command, check=True, capture_output=True, text=True)
    return [json.loads((out / f"{method}_rank{r}.json").read_text())["gib"] for r in range(ranks)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2])
    parser.add_argument("--out", default=None)
    parser.add_argument("--worker", nargs=3, metavar=("METHOD", "HF_DIR", "OUT"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = Path(tmp) / "hf"
        weights_gb = write_checkpoint(hf_dir)
        for ranks in args.ranks:
            for method in ("per-rank", "sharded"):
                out = Path(tmp) / f"{method}-{ranks}"
                out.mkdir()
                per_rank = run(method, ranks, hf_dir, out)
                rows.append({"ranks": ranks, "method": method,
                             "peak_gib_above_start_per_rank": [round(v, 3) for v in per_rank],
                             "node_total_gib": round(sum(per_rank), 3)})
    result = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
              "weights_gb": round(weights_gb, 3), "shapes": SHAPES, "rows": rows}
    print(f"weights {weights_gb:.2f} GB; peak host memory above start, GiB")
    print(f"{'ranks':>5} {'method':<9} {'node total':>10}  per rank")
    for row in rows:
        print(f"{row['ranks']:>5} {row['method']:<9} {row['node_total_gib']:>10.2f}  "
              f"{row['peak_gib_above_start_per_rank']}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
