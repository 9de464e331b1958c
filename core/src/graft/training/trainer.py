"""`Trainer`: builds a run from the composed config and trains it, rank by rank."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from graft.checkpoint.manager import CheckpointManager
from graft.config.auto import choices_comment, describe_choices, resolve_auto
from graft.data.tokenizer import load_tokenizer
from graft.engine.distributed.env import TRAINER, DistEnv, init_distributed, rank_roles
from graft.engine.distributed.parallelize import build_parallel_model, mixed_precision_policy
from graft.engine.distributed.sequence_parallel import sequence_parallel_size
from graft.engine.train_engine import TrainEngine
from graft.errors import CheckpointError, ConfigError, PluginError
from graft.export.hf import export_model_to_hf
from graft.models.build import load_local_config
from graft.output_dirs import check_output_dir
from graft.plugins import get_plugin_manager
from graft.training.compile_cache import CacheCounters, use_compile_cache
from graft.training.job import TrainingJob, build_job
from graft.training.metrics import (
    MetricsLog,
    console_print,
    peak_memory_gib,
    print_summary,
)
from graft.training.optim import build_optimizer, build_scheduler
from graft.training.run_dir import (
    config_changes,
    config_text,
    resolve_run_dir,
    truncate_metrics,
    write_config,
)
from graft.training.samples import truncate_samples
from graft.training.timing import RunClock

logger = logging.getLogger("graft.train")


def build_engine(cfg: Any, env: DistEnv, *, pad_token_id: int) -> TrainEngine:
    """Model (preset or local), parallelized; AdamW; schedule."""
    model, family = build_parallel_model(env, cfg=cfg)
    optimizer = build_optimizer(model, cfg.optim, env.device)
    scheduler = build_scheduler(optimizer, cfg.optim, cfg.trainer.total_steps)
    policy = mixed_precision_policy(cfg.engine.mixed_precision, env.device)
    compute_dtype = policy.param_dtype or next(model.parameters()).dtype
    return TrainEngine(model, family, optimizer, scheduler, env, cfg, compute_dtype, pad_token_id,
                       say=console_print)


class Trainer:
    """One training run: `fit` trains ``trainer.total_steps`` steps and returns the metrics.

    ``cfg`` as composed; `auto` settings are resolved for the device here (`self.cfg` holds
    the values chosen, config.yaml the settings as written and what `auto` chose in a comment).
    A job with an ``after_step(engine, step=, total_steps=)`` method (RL: validation, samples)
    gets it called before the first step (step 0) and after every step; the metrics it returns
    join the step's (step 0's make a record of their own).

    Resuming says which settings changed since the checkpoint was saved and writes
    config.yaml only once the checkpoint loaded. A run whose checkpoint to resume from is at
    ``trainer.total_steps`` or later is complete: nothing is built, and `fit` says so and
    returns no metrics.
    """

    def __init__(self, cfg: Any) -> None:
        self.clock = RunClock()  # for time_to_first_step_s
        self.manager = get_plugin_manager()
        self.env = init_distributed(device_preference=cfg.engine.device,
                                    ep_size=cfg.engine.ep_size,
                                    sp_size=sequence_parallel_size(cfg=cfg,
                                                                   manager=self.manager),
                                    roles=rank_roles(cfg, self.manager))
        self.role_runner: Callable[[], Any] | None = None
        self.run_dir = resolve_run_dir(cfg, is_main=self.env.is_main)
        written = cfg
        self.cfg = cfg = self._resolve_auto(cfg)
        self.checkpoints = CheckpointManager(self.run_dir, cfg.checkpoint, self.env)
        self.resume_from = self.checkpoints.resume_path()
        self.finished_step = finished_step(self.resume_from, cfg.trainer.total_steps)
        if self.finished_step is not None:
            return  # nothing to build: `fit` says the run is complete
        if self.env.role != TRAINER:
            self.role_runner = self._role_runner()
            return
        self.compile_cache_dir = use_compile_cache(cfg.engine.compile_cache_dir)
        self.cache_counters = CacheCounters()
        self._first_step_done = False
        if cfg.export.hf_at_end:  # refused before training, not after it (nothing is lost)
            check_output_dir(self.run_dir / "hf", protected={"the run directory": self.run_dir},
                             label="the end-of-run export folder",
                             hint="move it away, or set export.hf_at_end=false")
        torch.manual_seed(cfg.trainer.seed)
        if cfg.model.path:
            load_local_config(cfg.model.path)  # a bad model.path is reported before anything else
        self.tokenizer = load_tokenizer(cfg.data.tokenizer, cfg.model.path)
        self.job: TrainingJob = build_job(cfg, tokenizer=self.tokenizer, env=self.env)
        self.engine = build_engine(cfg, self.env, pad_token_id=self.tokenizer.pad_token_id)
        _check_vocab(self.tokenizer, self.engine.model.config)
        self.step = 0
        # The config as saved in config.yaml and in every checkpoint (built once, not per save).
        self.config_yaml = (config_text(written, str(self.run_dir))
                            + choices_comment(self.auto_choices))
        self._resume()
        if self.env.is_main:  # only now: a rejected resume leaves the run's config.yaml as it was
            write_config(self.run_dir, self.config_yaml)
        self.job.attach(self.engine, self.run_dir)  # after resume: vLLM starts from these weights

    def _role_runner(self) -> Callable[[], Any]:
        """What this rank runs in place of training: the runner of the plugin that gave it
        its role (``graft_role_runner``)."""
        runner = self.manager.hook.graft_role_runner(role=self.env.role, cfg=self.cfg,
                                                     env=self.env, run_dir=self.run_dir)
        if runner is None:
            raise PluginError(f"rank {dist.get_rank()} has the role {self.env.role!r}, which "
                              f"no plugin runs (graft_role_runner); `graft plugins` lists the "
                              f"loaded plugins")
        return runner

    def _resolve_auto(self, cfg: Any) -> Any:
        """``cfg`` with its `auto` settings chosen for this rank's device (said on rank 0)."""
        resolved, self.auto_choices = resolve_auto(cfg, self.env.device.type)
        if self.env.is_main and self.auto_choices:
            logger.info("%s", describe_choices(self.auto_choices))
        return resolved

    def _resume(self) -> None:
        """Load the checkpoint to resume from, if any, saying which settings changed since it
        was saved; then drop the log lines of the steps this run does again (all of them when
        it starts over), so each step is logged once."""
        path = self.resume_from
        if path is not None:
            changes = config_changes(saved_config(path, self.run_dir), self.config_yaml)
            try:
                state = self.checkpoints.load(path, model=self.engine.model,
                                              optimizer=self.engine.optimizer)
            except CheckpointError as exc:
                if not changes:
                    raise
                raise CheckpointError(f"{exc}\nchanged since that checkpoint: "
                                      f"{'; '.join(changes)}") from exc
            self.step = state["step"]
            self.engine.scheduler.load_state_dict(state["scheduler"])
            self.job.load_state_dict(state["job"])
            if any(c.startswith(("optim.", "trainer.total_steps:")) for c in changes):
                self._apply_optim_settings()
            if self.env.is_main and changes:
                logger.info("resuming with settings changed since %s (applied from step %d "
                            "on): %s", path, self.step + 1, "; ".join(changes))
        if self.env.is_main:
            dropped = truncate_metrics(self.run_dir, self.step if path is not None else -1)
            truncate_samples(self.run_dir, self.step if path is not None else -1)
            if path is None and dropped:
                logger.info("%s holds no checkpoint to resume from: training starts over at "
                            "step 1 (metrics.jsonl and samples.jsonl start over too)",
                            self.run_dir)

    def _apply_optim_settings(self) -> None:
        """This config's AdamW settings and schedule over those the checkpoint restored (its
        optimizer state holds the learning rate and betas it was saved with)."""
        optim, scheduler = self.cfg.optim, self.engine.scheduler
        scheduler.base_lrs = [optim.lr] * len(scheduler.base_lrs)
        for group, factor in zip(self.engine.optimizer.param_groups, scheduler.lr_lambdas,
                                 strict=True):
            group.update(initial_lr=optim.lr, lr=optim.lr * factor(scheduler.last_epoch),
                         betas=tuple(optim.betas), eps=optim.eps,
                         weight_decay=optim.weight_decay)
        scheduler._last_lr = [group["lr"] for group in self.engine.optimizer.param_groups]

    def save_checkpoint(self) -> None:
        """Checkpoint the current step (model, optimizer, schedule, data position, RNG)."""
        state = {"scheduler": self.engine.scheduler.state_dict(), "job": self.job.state_dict()}
        self.checkpoints.save(self.step, model=self.engine.model,
                              optimizer=self.engine.optimizer, trainer_state=state,
                              config_yaml=self.config_yaml)

    def export_hf(self, out_dir: Path) -> None:
        """Write the current weights as a Hugging Face directory (every rank takes part);
        `ConfigError` when ``out_dir`` holds files Graft did not write."""
        from graft.checkpoint.layout import read_latest

        latest = read_latest(self.run_dir)
        saved = (f" (or convert the last checkpoint: `graft export --ckpt {latest} --out "
                 f"NEW_DIR`)" if latest is not None else ", or set export.hf_at_end=false")
        stats = export_model_to_hf(self.engine.model, out_dir, export_cfg=self.cfg.export,
                                   tokenizer=self.tokenizer, is_main=self.env.is_main,
                                   protected={"the run directory": self.run_dir},
                                   label="the end-of-run export folder",
                                   hint=f"move it away and rerun{saved}", group=self.env.group)
        logger.info("exported %d tensors (%.1f MB) to %s in %.2f s", stats.tensors,
                    stats.bytes_total / 1e6, out_dir, stats.seconds)

    def train_step(self) -> dict[str, Any]:
        """Run the next step (hooks, update, metrics) and return its metrics."""
        self.step += 1
        hook = self.manager.hook
        hook.graft_step_begin(step=self.step)
        started = time.perf_counter()
        metrics: dict[str, Any] = {"step": self.step, **self.job.step(self.engine)}
        elapsed = time.perf_counter() - started
        metrics.update(lr=self.engine.scheduler.get_last_lr()[0], step_time_s=elapsed,
                       tokens_per_s=metrics["tokens"] / elapsed,
                       peak_memory_gib=peak_memory_gib(self.env.device))
        if not self._first_step_done:
            metrics.update(self._first_step_metrics())
        metrics.update(self._after_step(self.step))
        hook.graft_step_end(step=self.step, metrics=metrics)
        return metrics

    def _first_step_metrics(self) -> dict[str, Any]:
        """``time_to_first_step_s`` (from the start of the ``graft`` command, or of the process
        for a library call, or this run's own when it is not the process's first, to the end of
        its first step; `graft.training.timing`; said on the console on rank 0) and
        torch.compile's cache hits and misses so far."""
        self._first_step_done = True
        seconds = self.clock.seconds()
        if self.env.is_main:
            console_print(f"time to first step: {seconds:.1f} s (from {self.clock.origin}; "
                 f"compile cache {self.compile_cache_dir})")
        return {"time_to_first_step_s": seconds, **self.cache_counters.metrics()}

    def _after_step(self, step: int) -> dict[str, Any]:
        after = getattr(self.job, "after_step", None)
        if after is None:
            return {}
        return after(self.engine, step=step, total_steps=self.cfg.trainer.total_steps)

    def fit(self) -> list[dict[str, Any]]:
        """Train until ``trainer.total_steps``; metrics go to the console and metrics.jsonl.

        The rollout engine is stopped when training ends, also when it ends with an error.
        """
        total = self.cfg.trainer.total_steps
        if self.finished_step is not None:
            if self.env.is_main:
                console_print(complete_message(self.run_dir, self.resume_from, total,
                                               hf_at_end=self.cfg.export.hf_at_end))
            return []
        if self.role_runner is not None:
            self.role_runner()
            return []
        every = max(1, self.cfg.trainer.log_every_steps)
        try:
            with MetricsLog(self.run_dir, total_steps=total, enabled=self.env.is_main,
                            start_step=self.step) as log:
                before = self._after_step(0) if self.step == 0 else {}
                if before:
                    log.log({"step": 0, **before}, print_line=False)
                self.manager.hook.graft_train_begin(cfg=self.cfg, run_dir=self.run_dir,
                                                    is_main=self.env.is_main,
                                                    start_step=self.step, metrics=before)
                while self.step < total:
                    metrics = self.train_step()
                    log.log(metrics, print_line=self.step % every == 0 or self.step == total)
                    if self.checkpoints.should_save(self.step, total):
                        self.save_checkpoint()
        finally:
            self.job.close()
        self.checkpoints.wait()
        self.manager.hook.graft_train_end(model=self.engine.model, cfg=self.cfg,
                                          run_dir=self.run_dir, is_main=self.env.is_main)
        if self.cfg.export.hf_at_end:
            self.export_hf(self.run_dir / "hf")
        if self.env.is_main:  # the steps' records (step 0 holds only what ran before them)
            print_summary([m for m in log.history if m["step"] > 0], self.run_dir,
                          wall_time_s=log.elapsed_s())
        return log.history


def train(cfg: Any = None, *, overrides: tuple[str, ...] | list[str] = ()) -> list[dict[str, Any]]:
    """The Python entry point for library users, ``graft.train``: train with ``cfg`` (a config
    from `graft.config.compose`), or compose one from ``overrides``; return the per-step
    metrics. Works in one process or under torchrun (``graft train`` calls it on every rank);
    the process group is shut down when it returns or raises."""
    from graft.config import compose
    from graft.engine.distributed.env import shutdown_distributed

    config = cfg if cfg is not None else compose(list(overrides))
    try:
        return Trainer(config).fit()
    finally:
        shutdown_distributed()


def finished_step(checkpoint: Path | None, total_steps: int) -> int | None:
    """The step of ``checkpoint`` when it is at ``total_steps`` or later (the run is complete),
    else None (also when its trainer.json cannot be read: the load reports that)."""
    if checkpoint is None:
        return None
    try:
        step = int(json.loads((checkpoint / "trainer.json").read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return step if step >= total_steps else None


def complete_message(run_dir: Path, checkpoint: Path, total_steps: int, *, hf_at_end: bool) -> str:
    """What a rerun of a finished run says instead of training (see `finished_step`)."""
    message = (f"{run_dir} is complete: its checkpoint {checkpoint} is at step "
               f"{finished_step(checkpoint, total_steps)} (trainer.total_steps={total_steps}), "
               f"so there is nothing to train. Raise trainer.total_steps to train on, or give "
               f"another trainer.run_dir to start a new run.")
    if hf_at_end and not (run_dir / "hf").exists():
        message += (f" Its end-of-run export is missing: `graft export --ckpt {checkpoint} "
                    f"--out {run_dir / 'hf'}` writes it.")
    return message


def saved_config(checkpoint: Path, run_dir: Path) -> str:
    """The config ``checkpoint`` was saved with (its config.yaml, else the run directory's);
    empty when neither exists."""
    for path in (checkpoint / "config.yaml", run_dir / "config.yaml"):
        if path.is_file():
            return path.read_text()
    return ""


def _check_vocab(tokenizer: Any, config: Any) -> None:
    if len(tokenizer) > config.vocab_size:
        raise ConfigError(f"the tokenizer has {len(tokenizer)} tokens but the model's vocabulary "
                          f"has {config.vocab_size}; use the model's own tokenizer (data.tokenizer)")
