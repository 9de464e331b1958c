"""Per-step metrics: one JSON object per line in ``metrics.jsonl``, and the console (rank 0)."""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path
from typing import Any

import torch

# metric key -> short console label
CONSOLE_KEYS = {"loss": "loss", "reward_mean": "reward", "train_infer_logprob_diff": "mismatch",
                "grad_norm": "gnorm", "lr": "lr", "tokens_per_s": "tok/s",
                "peak_memory_gib": "mem_gib"}


def peak_memory_gib(device: torch.device) -> float:
    """Peak memory of this process: allocated CUDA memory on GPU, resident set size on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


class MetricsLog:
    """Appends metrics to ``<run_dir>/metrics.jsonl`` and shows progress; silent off rank 0."""

    def __init__(self, run_dir: Path, *, total_steps: int, enabled: bool,
                 tensorboard: bool = False) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.enabled = enabled
        self.total_steps = total_steps
        self.history: list[dict[str, Any]] = []
        self._progress: Any = None
        self._task: Any = None
        self._tensorboard = _tensorboard_writer(run_dir) if (enabled and tensorboard) else None

    def __enter__(self) -> MetricsLog:
        if self.enabled:
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(TextColumn("[bold]step {task.completed}/{task.total}"),
                                      BarColumn(), TextColumn("{task.description}"),
                                      TimeRemainingColumn(), transient=True,
                                      disable=not sys.stderr.isatty())
            self._progress.__enter__()
            self._task = self._progress.add_task("", total=self.total_steps)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)
        if self._tensorboard is not None:
            self._tensorboard.close()

    def log(self, metrics: dict[str, Any], *, print_line: bool = True) -> None:
        """Record one step's metrics (must contain ``step``)."""
        self.history.append(metrics)
        if not self.enabled:
            return
        with self.path.open("a") as handle:
            handle.write(json.dumps(metrics) + "\n")
        if self._tensorboard is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and key != "step":
                    self._tensorboard.add_scalar(key, value, metrics["step"])
        line = format_metrics(metrics)
        if self._progress is not None:
            self._progress.update(self._task, completed=metrics["step"], description=line)
            if print_line:
                self._progress.console.print(f"step {metrics['step']:>5}  {line}")


def format_metrics(metrics: dict[str, Any]) -> str:
    """``loss 1.234  grad_norm 0.5 ...`` for the keys worth a glance."""
    parts = []
    for key, label in CONSOLE_KEYS.items():
        if key in metrics:
            value = metrics[key]
            parts.append(f"{label} {value:.4g}" if isinstance(value, float) else f"{label} {value}")
    return "  ".join(parts)


def _tensorboard_writer(run_dir: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(run_dir / "tensorboard"))
