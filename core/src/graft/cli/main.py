"""Entry point of the ``graft`` console script and ``python -m graft``.

Only argparse is imported up front, so ``graft --help`` stays fast; each subcommand imports what
it needs when it runs.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Sequence

from graft._version import __version__
from graft.cli import STARTED, ckpt_cmd, config_cmd, export_cmd, plugins_cmd, train_cmd
from graft.cli.common import add_global_plugin_option, collect_overrides
from graft.errors import GraftError

SUBCOMMANDS = (train_cmd, plugins_cmd, config_cmd, ckpt_cmd, export_cmd)


def build_parser() -> argparse.ArgumentParser:
    """The full ``graft`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="graft",
        description="Graft: LLM post-training (RL and SFT) with pip-installable plugins.",
    )
    parser.add_argument("--version", action="version", version=f"graft {__version__}")
    add_global_plugin_option(parser)  # also accepted after the subcommand
    # Not required: a bare `graft` prints this help (see `main`).
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in SUBCOMMANDS:
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the process exit code (2 for user errors)."""
    from graft.training.timing import mark_command_start

    mark_command_start(STARTED)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command is None and not extra:
        parser.print_help()
        return 0
    if args.command is None:
        parser.error(f"unrecognized arguments: {' '.join(extra)}; give a COMMAND")
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if extra and not getattr(args, "takes_overrides", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        args.overrides = collect_overrides(args, extra)
        return int(args.run(args) or 0)
    except GraftError as exc:
        if os.environ.get("GRAFT_DEBUG") == "1":
            traceback.print_exc()
        print(f"graft: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"graft: {interrupted_message(args)}", file=sys.stderr)
        return 130


def interrupted_message(args: argparse.Namespace) -> str:
    """``interrupted``, and what running the same command again does, when the subcommand set
    ``args.interrupt_note`` (a function returning that sentence)."""
    note = getattr(args, "interrupt_note", None)
    if note is None:
        return "interrupted"
    try:
        return f"interrupted; {note()}"
    except Exception:  # noqa: BLE001 - a failing note must not hide the interrupt itself
        return "interrupted"


if __name__ == "__main__":
    raise SystemExit(main())
