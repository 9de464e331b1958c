"""Per-step metrics: one JSON object per line in ``metrics.jsonl``, and the console (rank 0).

In a terminal the console is a live display (a progress bar and the latest metrics) with the
step lines and every other message printed above it: `console_print` for a message, and
`logging` records, whose terminal handlers write through the display while it is up (written
straight to the terminal they would be drawn over). Lines are fitted to the terminal's width.
A file or a pipe gets plain, complete lines.
"""

from __future__ import annotations

import json
import logging
import math
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# metric key -> short console label
CONSOLE_KEYS = {"loss": "loss", "reward_mean": "reward", "train_infer_logprob_diff": "mismatch",
                "grad_norm": "gnorm", "lr": "lr", "tokens_per_s": "tok/s",
                "peak_memory_gib": "mem_gib"}


# The live display's console while one is up (rank 0, in a terminal), for `console_print`.
_live_console: Any = None


def console_print(text: str) -> None:
    """Print ``text`` (a message, one or more lines) on rank 0's console: above the live
    progress display while one is up, so the display is redrawn below it, else to stdout.
    Call it on rank 0 only, as anything that prints."""
    if _live_console is None:
        print(text, flush=True)
    else:
        _live_console.print(text, markup=False, highlight=False, crop=False, soft_wrap=True)


def peak_memory_gib(device: torch.device) -> float:
    """Peak memory of this process: allocated CUDA memory on GPU, resident set size on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


class MetricsLog:
    """Appends metrics to ``<run_dir>/metrics.jsonl`` and shows progress; silent off rank 0.

    ``start_step``: the step training continues after (0 for a new run), from which the
    time left is estimated.
    """

    def __init__(self, run_dir: Path, *, total_steps: int, enabled: bool,
                 start_step: int = 0) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.enabled = enabled
        self.total_steps = total_steps
        self.start_step = start_step
        self.history: list[dict[str, Any]] = []
        self._progress: Any = None
        self._task: Any = None
        self.started = time.perf_counter()

    def __enter__(self) -> MetricsLog:
        # A live progress bar only in a terminal; a file or a pipe gets plain, unwrapped lines.
        global _live_console
        if self.enabled and sys.stdout.isatty():
            self._progress = step_progress()
            self._progress.__enter__()
            self._task = self._progress.add_task("", total=self.total_steps)
            _live_console = self._progress.console
            self._restore_logging = route_logging_through(self._progress.console)
        return self

    def __exit__(self, *exc: object) -> None:
        global _live_console
        if self._progress is not None:
            self._progress.__exit__(*exc)
            self._restore_logging()
            _live_console = None

    def log(self, metrics: dict[str, Any], *, print_line: bool = True) -> None:
        """Record one step's metrics (must contain ``step``)."""
        self.history.append(metrics)
        if not self.enabled:
            return
        with self.path.open("a") as handle:
            handle.write(json_line(metrics) + "\n")
        if self._progress is not None:
            # One column spare: a terminal may wrap a line that fills the last one.
            width = self._progress.console.width - 1
            self._progress.update(self._task, completed=metrics["step"],
                                  description=format_metrics(metrics, width=width))
            if print_line:
                prefix = f"step {metrics['step']:>{len(str(self.total_steps))}}  "
                line = prefix + format_metrics(metrics, width=width - len(prefix))
                self._progress.console.print(line, markup=False, highlight=False)
        elif print_line:
            step = metrics["step"]
            eta = self.eta_s(step)
            print(f"step {step:>{len(str(self.total_steps))}}/{self.total_steps}  "
                  f"{format_metrics(metrics)}" + (f"  eta {_clock(eta)}" if eta else ""),
                  flush=True)

    def elapsed_s(self) -> float:
        """Wall-clock seconds since this log was created (at the start of training)."""
        return time.perf_counter() - self.started

    def eta_s(self, step: int) -> float | None:
        """Seconds left after ``step``: the mean wall time of this run's steps so far (each
        with its checkpoint saves and validations) times the steps left; None before the
        first step of this run and after the last."""
        done = step - self.start_step
        if done <= 0 or step >= self.total_steps:
            return None
        return self.elapsed_s() / done * (self.total_steps - step)


def step_progress() -> Any:
    """The live display in a terminal: ``step N/T``, a bar and the time left on one line, the
    latest metrics below it (on their own line, so they never push the step count or the time
    left out of a narrow terminal)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
    from rich.text import Text

    class StepProgress(Progress):
        def get_renderables(self) -> Any:
            yield self.make_tasks_table(self.tasks)
            for task in self.tasks:
                if task.description:
                    yield Text(task.description)

    return StepProgress(TextColumn("[bold]step {task.completed}/{task.total}"), BarColumn(),
                        TimeRemainingColumn(), transient=True)


def route_logging_through(console: Any) -> Callable[[], None]:
    """Point every `logging` stream handler that writes to a terminal at ``console`` (a live
    display's), so log records are printed above the display rather than over it; return the
    function that points them back."""
    from rich.file_proxy import FileProxy

    loggers = [logging.getLogger(), *(item for item in logging.Logger.manager.loggerDict.values()
                                      if isinstance(item, logging.Logger))]
    swapped = []
    for handler in {id(h): h for each in loggers for h in each.handlers}.values():
        stream = getattr(handler, "stream", None)
        if (isinstance(handler, logging.StreamHandler)
                and not isinstance(handler, logging.FileHandler)
                and not isinstance(stream, FileProxy)
                and getattr(stream, "isatty", lambda: False)()):
            swapped.append((handler, handler.setStream(FileProxy(console, stream))))

    def restore() -> None:
        for handler, stream in swapped:
            handler.setStream(stream)

    return restore


def format_metrics(metrics: dict[str, Any], *, width: int | None = None) -> str:
    """``loss 1.234  gnorm 0.5 ...`` for the keys worth a glance (`CONSOLE_KEYS`, in order).

    With ``width`` (columns: a terminal's), numbers are compact (3 significant digits, whole
    numbers from 100) and, if the line is still wider, the fields last in `CONSOLE_KEYS` are
    left out until it fits; without it, every field with 4 significant digits.
    """
    parts = []
    for key, label in CONSOLE_KEYS.items():
        if key in metrics:
            value = metrics[key]
            if isinstance(value, float):
                value = _compact(value) if width is not None else f"{value:.4g}"
            parts.append(f"{label} {value}")
    while width is not None and len(parts) > 1 and len("  ".join(parts)) > width:
        parts.pop()
    return "  ".join(parts)


def _compact(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _clock(seconds: float) -> str:
    """``h:mm:ss``, as the terminal's progress display shows the time left."""
    whole = round(seconds)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def json_line(metrics: dict[str, Any]) -> str:
    """``metrics`` as one line of strict JSON: a non-finite number (NaN, inf) is written as
    ``null`` and its key listed in ``nonfinite`` with the value as text (``"nan"``, ``"inf"``,
    ``"-inf"``), since JSON has no such numbers (``jq`` and JavaScript reject a bare ``NaN``)."""
    nonfinite: dict[str, str] = {}
    record = {key: _finite(value, key, nonfinite) for key, value in metrics.items()}
    if nonfinite:
        record["nonfinite"] = nonfinite
    return json.dumps(record, allow_nan=False)


def _finite(value: Any, key: str, nonfinite: dict[str, str]) -> Any:
    """``value`` with each non-finite float replaced by None and noted under its key
    (``key.0`` for an item of a list)."""
    if isinstance(value, float) and not math.isfinite(value):
        nonfinite[key] = str(value)
        return None
    if isinstance(value, (list, tuple)):
        return [_finite(item, f"{key}.{i}", nonfinite) for i, item in enumerate(value)]
    if isinstance(value, dict):
        return {k: _finite(item, f"{key}.{k}", nonfinite) for k, item in value.items()}
    return value


def print_summary(history: list[dict[str, Any]], run_dir: Any, *,
                  wall_time_s: float | None = None) -> None:
    """A short table: first and last loss (and reward), throughput, time, where outputs are.

    ``wall_time_s`` is the whole of training (steps, checkpoints, export); the step time, the
    sum of the steps' ``step_time_s``, is shown next to it.
    """
    from rich.console import Console
    from rich.table import Table

    if not history:
        return
    table = Table(title="graft train: summary", show_header=False)
    first, last = history[0], history[-1]
    for key in ("loss", "reward_mean"):
        if key in first:
            table.add_row(key, f"{first[key]:.4f} (step {first['step']}) -> "
                               f"{last[key]:.4f} (step {last['step']})")
    table.add_row("steps", str(last["step"]))
    table.add_row("tokens/s (mean)", f"{sum(m['tokens_per_s'] for m in history) / len(history):.0f}")
    if wall_time_s is not None:
        table.add_row("wall time (s)", f"{wall_time_s:.1f}")
    table.add_row("step time (s)", f"{sum(m['step_time_s'] for m in history):.1f}")
    table.add_row("peak memory (GiB)", f"{max(m['peak_memory_gib'] for m in history):.2f}")
    table.add_row("run dir", str(run_dir))
    Console().print(table)
