"""``graft config show|check``: print the composed config, or validate YAML files."""

from __future__ import annotations

import argparse
from typing import Any

from graft.cli.common import config_options, load_for, plugin_options


def add_parser(subparsers: Any) -> None:
    """Register ``graft config show [overrides]`` and ``graft config check [PATH...]``."""
    parser = subparsers.add_parser("config", help="show or check configs")
    commands = parser.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    show = commands.add_parser(
        "show", parents=[plugin_options(), config_options()],
        help="print the composed, validated config as YAML")
    show.set_defaults(run=run_show, takes_overrides=True)
    check = commands.add_parser(
        "check", parents=[plugin_options()],
        help="check YAML files against the schema (default: every preset of Graft and of the "
             "loaded plugins, and ./examples)")
    check.add_argument("paths", nargs="*", metavar="PATH", help="YAML files or folders")
    check.set_defaults(run=run_check)


def run_show(args: argparse.Namespace) -> int:
    """Compose and print."""
    from graft.config import compose, to_yaml

    manager = load_for(args)
    print(to_yaml(compose(args.overrides, args.config, manager=manager)), end="")
    return 0


def run_check(args: argparse.Namespace) -> int:
    """Check each file (default: `graft.config.check.default_sources`); exit 2 when any is
    invalid."""
    from graft.config.check import check_config_files, default_sources
    from graft.errors import ConfigError

    manager = load_for(args)
    if args.paths:
        files = list(args.paths)
    else:
        sources = default_sources(manager)
        print("checking (no PATH given):" if sources else
              "no YAML files to check: no presets are installed and there is no ./examples")
        for source in sources:
            print(f"  {len(source.files)} file{'s' if len(source.files) != 1 else ''}: "
                  f"{source.label}")
        files = [f for source in sources for f in source.files]
        if not files:
            return 0
    results = check_config_files(files, manager)
    if not results:
        print("no YAML files to check")
        return 0
    for result in results:
        print(f"{'ok  ' if result.error is None else 'FAIL'} {result.path}")
        if result.error is not None:
            print(f"     {result.error}")
    failed = sum(r.error is not None for r in results)
    files = f"{len(results)} config file{'s' if len(results) != 1 else ''}"
    if failed:
        raise ConfigError(f"{failed} of {files} {'is' if len(results) == 1 else 'are'} invalid")
    print(f"{files} valid")
    return 0
