"""`TrainingJob`: what a ``trainer.mode`` provides to the `graft.training.trainer.Trainer`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from graft.engine.train_engine import TrainEngine


class TrainingJob(Protocol):
    """One kind of training (``rl``, ``sft``, or a plugin's), driven step by step.

    The trainer builds the engine, calls `attach` once (after a resume), then `step` every
    step, `state_dict`/`load_state_dict` for checkpoints, and `close` at the end (also after an
    error). A job may also have ``after_step(engine, *, step, total_steps) -> dict``, called on
    every rank before the first step (``step`` 0) and after each step; its metrics join that
    step's record (RL: validation and the samples log, `graft.rl.job.RLJob.after_step`).
    """

    def attach(self, engine: TrainEngine, run_dir: Path) -> None:
        """Start what the job needs besides the engine (a rollout engine, a reference)."""

    def step(self, engine: TrainEngine) -> dict[str, float]:
        """Train one optimizer step (or several) on this rank; return its metrics, including
        ``tokens`` (trained tokens this step, over all ranks) and ``loss``."""

    def state_dict(self) -> dict[str, Any]:
        """JSON-ready state to checkpoint (the data position)."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a checkpointed `state_dict`."""

    def close(self) -> None:
        """Release what `attach` started; idempotent."""


def validation_due(step: int, *, every: int, total_steps: int) -> bool:
    """Whether a job validates after ``step`` (its ``after_step``; 0: before the first): at 0,
    every ``every`` steps and at the last step; never when ``every`` is 0."""
    return every > 0 and (step == 0 or step % every == 0 or step == total_steps)


def trainer_modes(manager: Any = None) -> dict[str, Any]:
    """Every trainer-mode job factory by name (core and plugins); two providers of one name is
    a `PluginError` naming both."""
    from graft.plugins import get_plugin_manager
    from graft.plugins.registry import collect_named

    return collect_named(manager or get_plugin_manager(), "graft_trainer_modes", "trainer mode")


def build_job(cfg: Any, *, tokenizer: Any, env: Any) -> TrainingJob:
    """The job of ``trainer.mode``, built by its factory (with the keywords it takes)."""
    from graft.plugins.keywords import call_with_keywords

    factory = trainer_modes()[cfg.trainer.mode]
    return call_with_keywords(factory, cfg=cfg, tokenizer=tokenizer, env=env)
