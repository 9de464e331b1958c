"""The core's default ``graft_export_slots`` (a built-in plugin; torch is imported lazily)."""

from __future__ import annotations

from typing import Any

from graft.hookspecs import hookimpl


@hookimpl(trylast=True)
def graft_export_slots(name: str, tensor: Any, ctx: Any) -> list[tuple[str, Any]]:
    """Standard and fused-expert layouts through transformers' own conversion mapping."""
    from graft.export.handlers import transformers_layout

    return transformers_layout(name, tensor, ctx)
