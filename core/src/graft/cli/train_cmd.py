"""``graft train``: compose the config, then train here or launch torchrun ranks that do."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import Any

from graft.cli.common import config_options, load_for, plugin_options

# torchrun options passed through unchanged (multi-node runs use torchrun's own launcher).
TORCHRUN_OPTIONS = ("--nnodes", "--node-rank", "--rdzv-endpoint", "--rdzv-backend", "--rdzv-id",
                    "--rdzv-conf", "--master-addr", "--master-port", "--max-restarts",
                    "--monitor-interval", "--local-addr")


def add_parser(subparsers: Any) -> None:
    """Register ``graft train [--nproc N] [--config F] [KEY=VALUE...]``."""
    parser = subparsers.add_parser(
        "train", parents=[plugin_options(), config_options()],
        help="train (SFT or RL) on the composed config",
        description="Train. With --nproc N (or any torchrun option) Graft starts torchrun, "
                    "which runs N ranks of this same command.")
    parser.add_argument("--nproc", type=int, default=None, metavar="N",
                        help="processes per node (GPUs per node, or CPU ranks with gloo)")
    group = parser.add_argument_group("torchrun options (passed through)")
    for option in TORCHRUN_OPTIONS:
        group.add_argument(option, default=None, dest=_dest(option))
    parser.set_defaults(run=run, takes_overrides=True)


def _dest(option: str) -> str:
    return "torchrun_" + option.lstrip("-").replace("-", "_")


def run(args: argparse.Namespace) -> int:
    """Validate the config and check its paths; launch torchrun if asked, else train in this
    process (also as one of torchrun's ranks)."""
    from graft.engine.distributed.launch import rank_errors_recorded, use_short_openmp_spin

    use_short_openmp_spin()  # before anything imports torch
    with rank_errors_recorded():
        from graft.config import compose
        from graft.config.validate import preflight

        manager = load_for(args)
        cfg = compose(args.overrides, args.config, manager=manager)
        preflight(cfg, manager)  # errors that need no ranks, found before torchrun starts them
        torchrun_args = [item for option in TORCHRUN_OPTIONS
                         if (value := getattr(args, _dest(option))) is not None
                         for item in (option, value)]
        if (args.nproc or torchrun_args) and "LOCAL_RANK" not in os.environ:
            return launch_torchrun(args, torchrun_args)
        return train_here(args, cfg)


def train_here(args: argparse.Namespace, cfg: Any) -> int:
    """Train ``cfg`` in this process: the whole run, or one torchrun rank of it."""
    _quiet_non_main_ranks()
    from graft.engine.distributed.env import end_torchrun_worker
    from graft.training.trainer import train

    if int(os.environ.get("RANK", "0")) == 0:
        args.interrupt_note = lambda: resume_note(cfg)
    train(cfg)
    # Only after success: a failing rank must raise and exit non-zero so torchrun reports it.
    end_torchrun_worker()
    return 0


def resume_note(cfg: Any) -> str:
    """What running the same command again does, read from disk now: the checkpoint it resumes
    from, or that it starts over. Said after Ctrl-C (rank 0 of the run)."""
    from graft.checkpoint.layout import read_latest
    from graft.training.run_dir import RUNS, find_resumable_run

    resume = cfg.checkpoint.resume
    if resume == "never":
        return "checkpoint.resume=never: the next run starts over"
    if resume != "auto":
        from graft.checkpoint.reader import resolve_checkpoint

        return f"rerun the same command to resume from {resolve_checkpoint(resume)}"
    # The run directory the next run picks: the configured one, else (like
    # `graft.training.run_dir.resolve_run_dir`) the unfinished run of this config under runs/.
    run_dir = Path(cfg.trainer.run_dir) if cfg.trainer.run_dir else find_resumable_run(RUNS, cfg)
    latest = read_latest(run_dir) if run_dir is not None else None
    if latest is None:
        return "no checkpoint to resume from yet: the next run starts over"
    return f"rerun the same command to resume from {latest}"


def launch_torchrun(args: argparse.Namespace, torchrun_args: list[str]) -> int:
    """Run torchrun's launcher, here, on ``-m graft train <same config>``; return its exit
    code (a failed rank's own, see `graft.engine.distributed.launch.run_torchrun`)."""
    from graft.engine.distributed.launch import run_torchrun

    # One node without rendezvous options: --standalone picks a free port, so concurrent runs
    # on one machine do not collide on torchrun's default port.
    standalone = [] if torchrun_args else ["--standalone"]
    command = [*standalone, "--nproc-per-node", str(args.nproc or 1), *torchrun_args,
               "-m", "graft", "train"]
    for item in args.config:
        command += ["--config", item]
    command += list(args.overrides)
    # The ranks read --disable-plugin from GRAFT_DISABLE_PLUGINS, which load_for exported.
    logging.getLogger("graft").info("launching: torchrun %s", " ".join(command))
    return run_torchrun(command)


def _quiet_non_main_ranks() -> None:
    if int(os.environ.get("RANK", "0")) != 0:
        logging.getLogger().setLevel(logging.WARNING)
