"""`WandbLogger`: one W&B run per Graft run, continued when the Graft run resumes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from graft.config import to_yaml
from graft.errors import ConfigError
from graft_wandb.config import WandbConfig, require_wandb

# In the run directory: the W&B run's id and the last step sent to it.
STATE_FILE = "wandb-run.json"


class WandbLogger:
    """Sends each step's numeric metrics to a W&B run at W&B step = the Graft step.

    A new Graft run (``start_step`` 0) starts a new W&B run; a resumed one continues the W&B
    run whose id ``<run_dir>/wandb-run.json`` holds, and sends only the steps after the last
    one sent there: W&B keeps a step once, so a step done again after a crash keeps the
    values first sent (metrics.jsonl holds the new ones).
    """

    def __init__(self, cfg: Any, settings: WandbConfig, run_dir: Path, start_step: int) -> None:
        require_wandb()
        import wandb
        import yaml

        self.state_path = run_dir / STATE_FILE
        state = read_state(self.state_path) if start_step > 0 else None
        self.last_step = state["last_step"] if state else -1
        try:
            self.run = wandb.init(
                project=settings.project or os.environ.get("WANDB_PROJECT") or "graft",
                entity=settings.entity,
                mode=None if settings.mode == "auto" else settings.mode,
                name=settings.name or run_dir.name, group=settings.group,
                tags=list(settings.tags), id=state["id"] if state else None,
                resume="allow" if state else None,
                config=yaml.safe_load(to_yaml(cfg)),
                dir=None if os.environ.get("WANDB_DIR") else str(run_dir))
        except wandb.errors.Error as exc:
            raise ConfigError(f"features.wandb: W&B could not start the run ({exc}); log in "
                              f"with `wandb login` (or set WANDB_API_KEY), or set "
                              f"features.wandb.mode=offline") from exc
        self.run_id = self.run.id
        self._write_state()

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Send ``metrics``' numbers (``step`` itself left out) as W&B step ``step``, unless
        that step was sent before."""
        if step <= self.last_step:
            return
        numbers = {key: value for key, value in metrics.items()
                   if key != "step" and isinstance(value, (int, float))
                   and not isinstance(value, bool)}
        self.run.log(numbers, step=step)
        self.last_step = step
        self._write_state()

    def finish(self) -> None:
        """End the W&B run (offline: its files are complete for `wandb sync`)."""
        self.run.finish()

    def _write_state(self) -> None:
        temporary = self.state_path.with_name(f".{STATE_FILE}.tmp")
        temporary.write_text(json.dumps({"id": self.run_id, "last_step": self.last_step}) + "\n")
        os.replace(temporary, self.state_path)


def read_state(path: Path) -> dict[str, Any] | None:
    """``{"id", "last_step"}`` of ``path`` (`STATE_FILE`), or None when there is none or it
    cannot be read (then a new W&B run starts)."""
    try:
        state = json.loads(path.read_text())
        return {"id": str(state["id"]), "last_step": int(state["last_step"])}
    except (OSError, ValueError, KeyError, TypeError):
        return None
