"""``graft plugins``: what was discovered, what loaded, what failed and why."""

from __future__ import annotations

import argparse
import json
from typing import Any

from graft.cli.common import load_for, plugin_options
from graft.plugins import GraftPluginManager, PluginRecord

TITLE = "Graft plugins (entry-point group graft.plugins)"
UNDECLARED_AGGREGATOR = ("implements graft_loss_aggregate but declares no mode: loss.loss_agg_mode "
                         "rejects its modes until it also implements graft_loss_agg_modes")


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
    warnings = plugin_warnings(manager)
    if args.json:
        rows = [{**r.as_dict(), "warnings": warnings.get(r.name, [])} for r in records]
        print(json.dumps(rows, indent=2))
        return 0
    from rich.console import Console

    console = Console()
    if records:
        console.print(plugin_table(records, warnings, width=console.width))
    else:
        console.print("No Graft plugins found (pip install one, or check GRAFT_PLUGINS).")
    return 0


def plugin_warnings(manager: GraftPluginManager) -> dict[str, list[str]]:
    """Plugin name -> what is wrong in how a loaded plugin is written or installed (a
    dependency at a version it does not declare)."""
    from graft.losses.registry import undeclared_aggregators

    found = {name: list(record.warnings) for name, record in manager.records.items()
             if record.warnings}
    for name in undeclared_aggregators(manager):
        found.setdefault(name, []).append(UNDECLARED_AGGREGATOR)
    return found


def plugin_table(records: list[PluginRecord], warnings: dict[str, list[str]], *,
                 width: int) -> Any:
    """The rich table ``graft plugins`` prints, ``width`` columns wide at most.

    One column per field when that fits without breaking a word; otherwise two columns, the
    name and the rest, so that no name (plugin, distribution, hook, section) is ever split.
    """
    if _wide_width(records, warnings) <= width:
        return _wide_table(records, warnings)
    return _narrow_table(records, warnings)


def _wide_width(records: list[PluginRecord], warnings: dict[str, list[str]]) -> int:
    """Columns the one-column-per-field table needs so that no word is broken."""
    def longest(words: list[str]) -> int:
        return max(map(len, words), default=1)

    widths = [
        longest(["name", *(r.name for r in records)]),
        longest(["distribution", *(r.distribution for r in records)]),
        longest(["version", *(r.version for r in records)]),
        longest(["status", *(w for r in records
                             for w in [r.status, *" ".join(warnings.get(r.name, [])).split()])]),
        longest(["hooks", *(f"{h}," for r in records for h in r.hooks)]),
        longest(["section", *(f"{s}," for r in records for s in _sections(r).split(", "))]),
    ]
    return sum(widths) + 3 * len(widths) + 1  # one space of padding each side, one border


def _status(record: PluginRecord, warnings: dict[str, list[str]]) -> str:
    text = record.status
    if record.error is not None:
        text = f"[red]{text}: {escape(record.error)}[/red]"
    for warning in warnings.get(record.name, []):
        text += f"\n[yellow]warning: {escape(warning)}[/yellow]"
    return text


def _sections(record: PluginRecord) -> str:
    return ", ".join(f"features.{s}" for s in record.config_sections) or "-"


def _wide_table(records: list[PluginRecord], warnings: dict[str, list[str]]) -> Any:
    from rich.table import Table

    table = Table(title=TITLE)
    for column in ("name", "distribution", "version"):
        table.add_column(column, no_wrap=True)
    table.add_column("status", overflow="fold")
    table.add_column("hooks")  # wraps between hook names only: each is one word
    table.add_column("config section")
    for r in records:
        table.add_row(r.name, r.distribution, r.version, _status(r, warnings),
                      ", ".join(r.hooks) or "-", _sections(r))
    return table


def _narrow_table(records: list[PluginRecord], warnings: dict[str, list[str]]) -> Any:
    from rich.table import Table

    table = Table(title=TITLE, show_lines=True)
    table.add_column("name", no_wrap=True)
    table.add_column("distribution, status, hooks, config section", overflow="fold")
    for r in records:
        details = (f"{r.distribution} {r.version}, {_status(r, warnings)}\n"
                   f"hooks: {', '.join(r.hooks) or '-'}\nconfig: {_sections(r)}")
        table.add_row(r.name, details)
    return table


def escape(text: str) -> str:
    """``text`` with rich markup characters escaped (plugin errors may contain brackets)."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)
