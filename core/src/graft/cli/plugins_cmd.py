"""``graft plugins``: what was discovered, what loaded, what failed and why."""

from __future__ import annotations

import argparse
import json
from typing import Any

from graft.cli.common import load_for, plugin_options


def add_parser(subparsers: Any) -> None:
    """Register ``graft plugins [--json] [--all]``."""
    parser = subparsers.add_parser(
        "plugins", parents=[plugin_options()],
        help="list discovered plugins: status, hooks, config section",
        description="List every plugin in the entry-point group graft.plugins. "
                    "GRAFT_PLUGINS=a,b is an allowlist (empty = none); GRAFT_TRACE_PLUGINS=1 "
                    "traces hook calls.")
    parser.add_argument("--json", action="store_true", help="print JSON for machines")
    parser.add_argument("--all", action="store_true", help="include Graft's built-in plugins")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Print the plugin table (or JSON)."""
    manager = load_for(args)
    records = [r for r in manager.records.values() if args.all or r.status != "builtin"]
    if args.json:
        print(json.dumps([r.as_dict() for r in records], indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Graft plugins (entry-point group graft.plugins)")
    for column in ("name", "distribution", "version", "status", "hooks", "config section"):
        table.add_column(column, overflow="fold")
    for r in records:
        status = r.status if r.error is None else f"[red]{r.status}: {r.error}[/red]"
        sections = ", ".join(f"features.{s}" for s in r.config_sections) or "-"
        table.add_row(r.name, r.distribution, r.version, status,
                      ", ".join(r.hooks) or "-", sections)
    console = Console()
    if records:
        console.print(table)
    else:
        console.print("No Graft plugins found (pip install one, or check GRAFT_PLUGINS).")
    return 0
