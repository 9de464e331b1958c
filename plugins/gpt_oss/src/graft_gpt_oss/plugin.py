"""The plugin's table of contents: every point where graft-gpt-oss touches Graft's core."""

from __future__ import annotations

from typing import Any

from graft import hookimpl


@hookimpl
def graft_model_families() -> list[Any]:
    """The ``gpt_oss`` family (preset ``tiny-gpt-oss``)."""
    from graft_gpt_oss.family import gpt_oss_family

    return [gpt_oss_family()]
