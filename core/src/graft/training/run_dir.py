"""The run directory: where config.yaml, metrics.jsonl, checkpoints and exports go."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import yaml

from graft.checkpoint.layout import read_latest, step_of, write_atomically
from graft.engine.distributed import broadcast_object

RUNS = Path("runs")


def resolve_run_dir(cfg: Any, *, is_main: bool) -> Path:
    """``trainer.run_dir``; otherwise the unfinished run of this same config under ``runs/`` (so
    rerunning an interrupted command resumes it), else a new ``runs/<timestamp>``. Rank 0
    (``is_main``) decides and broadcasts its answer; call it on every rank.
    """
    chosen = cfg.trainer.run_dir
    if chosen is None and is_main:  # only rank 0 scans runs/: the others take its answer
        resumable = find_resumable_run(RUNS, cfg) if cfg.checkpoint.resume == "auto" else None
        chosen = str(resumable or RUNS / time.strftime("%Y%m%d-%H%M%S"))
    return Path(broadcast_object(chosen))


def config_text(cfg: Any, run_dir: str | None) -> str:
    """The config as YAML with ``trainer.run_dir`` set to ``run_dir``."""
    from graft.config import to_yaml

    trainer = dataclasses.replace(cfg.trainer, run_dir=run_dir)
    return to_yaml(dataclasses.replace(cfg, trainer=trainer))


def _without_run_dir(text: str) -> Any:
    config = yaml.safe_load(text)
    config["trainer"]["run_dir"] = None
    return config


def find_resumable_run(root: Path, cfg: Any) -> Path | None:
    """The newest run under ``root`` with the same config whose last checkpoint is not final."""
    wanted = _without_run_dir(config_text(cfg, None))
    candidates = sorted((p for p in root.glob("*") if (p / "config.yaml").is_file()),
                        key=lambda p: p.stat().st_mtime, reverse=True) if root.is_dir() else []
    for run in candidates:
        if _without_run_dir((run / "config.yaml").read_text()) != wanted:
            continue
        latest = read_latest(run)
        if latest is not None and step_of(latest) < cfg.trainer.total_steps:
            return run
    return None


def write_config(run_dir: Path, text: str) -> None:
    """Save ``text`` (the run's `config_text`) as ``<run_dir>/config.yaml``, creating the folder."""
    run_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(run_dir / "config.yaml", text)


def truncate_metrics(run_dir: Path, last_step: int) -> None:
    """Drop metrics.jsonl lines of steps after ``last_step`` (logged before a crash, redone now)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return
    kept = [line for line in path.read_text().splitlines()
            if line.strip() and json.loads(line).get("step", 0) <= last_step]
    write_atomically(path, "".join(line + "\n" for line in kept))
