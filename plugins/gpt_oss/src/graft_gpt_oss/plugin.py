"""The plugin's table of contents: every point where graft-gpt-oss touches Graft's core.

Also a vLLM plugin (``vllm.general_plugins`` -> `graft_gpt_oss.vllm_reload.register`), which vLLM
loads in its own processes.
"""

from __future__ import annotations

from typing import Any

from graft import hookimpl


@hookimpl
def graft_model_families() -> list[Any]:
    """The ``gpt_oss`` family: preset ``tiny-gpt-oss``, routers, expert parallelism."""
    from graft_gpt_oss.family import gpt_oss_family

    return [gpt_oss_family()]


@hookimpl
def graft_export_slots(name: str, tensor: Any, ctx: Any) -> list[tuple[str, Any]] | None:
    """GPT-OSS's fused experts: passed through for a HF checkpoint, per expert for vLLM."""
    from graft_gpt_oss.export import gpt_oss_expert_slots

    return gpt_oss_expert_slots(name, tensor, ctx)
