"""The run directory: where config.yaml, metrics.jsonl, checkpoints and exports go."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

import yaml

from graft.checkpoint.layout import read_latest, step_of, write_atomically
from graft.engine.distributed.env import broadcast_object

RUNS = Path("runs")
logger = logging.getLogger("graft.train")


def resolve_run_dir(cfg: Any, *, is_main: bool) -> Path:
    """``trainer.run_dir``; otherwise the unfinished run of this same config under ``runs/`` (so
    rerunning an interrupted command resumes it), else a new ``runs/<timestamp>``. Rank 0
    (``is_main``) decides and broadcasts its answer; call it on every rank.
    """
    chosen = cfg.trainer.run_dir
    if chosen is None and is_main:  # only rank 0 scans runs/: the others take its answer
        resumable = find_resumable_run(RUNS, cfg) if cfg.checkpoint.resume == "auto" else None
        chosen = str(resumable or RUNS / time.strftime("%Y%m%d-%H%M%S"))
        finished = find_resumable_run(RUNS, cfg, finished=True) if resumable is None else None
        if finished is not None:  # a rerun of a finished command trains anew: say so
            logger.info("%s finished this same config (trainer.total_steps=%d); training a new "
                        "run in %s", finished, cfg.trainer.total_steps, chosen)
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


def find_resumable_run(root: Path, cfg: Any, *, finished: bool = False) -> Path | None:
    """The newest run under ``root`` with the same config whose last checkpoint is not final
    (with ``finished``: is final, at ``trainer.total_steps`` or later)."""
    wanted = _without_run_dir(config_text(cfg, None))
    candidates = sorted((p for p in root.glob("*") if (p / "config.yaml").is_file()),
                        key=lambda p: p.stat().st_mtime, reverse=True) if root.is_dir() else []
    for run in candidates:
        if _without_run_dir((run / "config.yaml").read_text()) != wanted:
            continue
        latest = read_latest(run)
        if latest is not None and (step_of(latest) >= cfg.trainer.total_steps) == finished:
            return run
    return None


def write_config(run_dir: Path, text: str) -> None:
    """Save ``text`` (the run's `config_text`) as ``<run_dir>/config.yaml``, creating the folder."""
    run_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(run_dir / "config.yaml", text)


def truncate_metrics(run_dir: Path, last_step: int) -> int:
    """Drop metrics.jsonl lines of steps after ``last_step`` (logged before a crash, redone now;
    -1 drops every line, for a run that starts over); return how many lines were dropped."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return 0
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    kept = [line for line in lines if json.loads(line).get("step", 0) <= last_step]
    if len(kept) < len(lines):
        write_atomically(path, "".join(line + "\n" for line in kept))
    return len(lines) - len(kept)


def config_changes(saved: str, current: str) -> list[str]:
    """``key: old -> new`` for every setting (dotted key) that differs between two config.yaml
    texts, ``trainer.run_dir`` left out (a checkpoint may be resumed into another run
    directory); a key only one of them has reads ``(absent)`` on the other side."""
    old, new = _flat(yaml.safe_load(saved) or {}), _flat(yaml.safe_load(current) or {})
    old.pop("trainer.run_dir", None)
    new.pop("trainer.run_dir", None)
    return [f"{key}: {_shown(old, key)} -> {_shown(new, key)}"
            for key in sorted(old.keys() | new.keys())
            if key not in old or key not in new or old[key] != new[key]]


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _shown(flat: dict[str, Any], key: str) -> str:
    if key not in flat:
        return "(absent)"
    return json.dumps(flat[key]) if not isinstance(flat[key], str) else flat[key]
