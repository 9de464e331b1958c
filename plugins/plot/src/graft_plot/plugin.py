"""The plugin's table of contents: its one point of contact with Graft's core."""

from __future__ import annotations

from typing import Any

from graft import hookimpl


@hookimpl
def graft_cli_commands() -> list[Any]:
    """``graft plot`` (`graft_plot.curves`)."""
    from graft_plot import curves

    return [curves]
