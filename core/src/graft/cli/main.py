"""Entry point of the ``graft`` console script and ``python -m graft``.

Only argparse is imported up front, so ``graft --help`` stays fast; each subcommand imports what
it needs when it runs. Plugins' subcommands (``graft_cli_commands``) are added only for a
command line that names no core command (and for the help), so a core command loads plugins
when it chooses to, honouring its ``--disable-plugin``.
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
from graft.errors import GraftError, PluginError

SUBCOMMANDS = (train_cmd, plugins_cmd, config_cmd, ckpt_cmd, export_cmd)
CORE_COMMANDS = ("train", "plugins", "config", "ckpt", "export")


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``graft`` argument parser: the core's subcommands, and the plugins' when ``argv``
    names none of the core's (`plugin_commands`)."""
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
    command, disabled = _command_word(argv or ())
    if argv is not None and command not in CORE_COMMANDS:
        for plugin_command in plugin_commands(disabled):
            try:
                plugin_command.add_parser(subparsers)
            except argparse.ArgumentError as exc:
                raise PluginError(f"a plugin's graft_cli_commands adds a command named like "
                                  f"another ({exc}); uninstall or disable one of the two "
                                  f"plugins (graft plugins lists them)") from exc
    return parser


def plugin_commands(disabled: Sequence[str] = ()) -> list[object]:
    """The subcommands plugins add (``graft_cli_commands``), loading the plugins (but
    ``disabled``)."""
    from graft.plugins import load_plugins

    return [command for result in load_plugins(disabled=disabled).hook.graft_cli_commands()
            for command in result]


def _command_word(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """The command ``argv`` names (its first word that is no option or an option's value), and
    the ``--disable-plugin NAME`` values before it."""
    disabled, words = [], iter(argv)
    for word in words:
        if word == "--disable-plugin":
            disabled.append(next(words, ""))
        elif not word.startswith("-"):
            return word, disabled
    return None, disabled


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the process exit code (2 for user errors)."""
    from graft.training.timing import mark_command_start

    mark_command_start(STARTED)
    try:
        parser = build_parser(sys.argv[1:] if argv is None else argv)
    except GraftError as exc:
        return report(exc)
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
        return report(exc)
    except KeyboardInterrupt:
        print(f"graft: {interrupted_message(args)}", file=sys.stderr)
        return 130


def report(exc: GraftError) -> int:
    """Print a Graft error as one line (and its traceback under ``GRAFT_DEBUG=1``); its exit
    code."""
    if os.environ.get("GRAFT_DEBUG") == "1":
        traceback.print_exc()
    print(f"graft: error: {exc}", file=sys.stderr)
    return exc.exit_code


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
