"""The plugin's table of contents: every point where graft-deepseek-v4 touches Graft's core."""

from __future__ import annotations

from typing import Any

from graft import hookimpl


@hookimpl
def graft_model_families() -> list[Any]:
    """The ``deepseek_v4`` family (preset ``tiny-deepseek-v4``)."""
    from graft_deepseek_v4.family import deepseek_v4_family

    return [deepseek_v4_family()]
