"""The run directory: where config.yaml, metrics.jsonl, checkpoints and exports go."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from graft.engine.distributed import broadcast_object


def resolve_run_dir(configured: str | None) -> Path:
    """``trainer.run_dir``, or ``runs/<timestamp>`` chosen by rank 0 and shared with all ranks."""
    chosen = configured or f"runs/{time.strftime('%Y%m%d-%H%M%S')}"
    return Path(broadcast_object(chosen))


def write_config(run_dir: Path, cfg: Any) -> None:
    """Save the composed config as ``<run_dir>/config.yaml`` (atomically)."""
    from graft.config import to_yaml

    run_dir.mkdir(parents=True, exist_ok=True)
    target = run_dir / "config.yaml"
    partial = target.with_suffix(".yaml.tmp")
    partial.write_text(to_yaml(cfg))
    partial.replace(target)
