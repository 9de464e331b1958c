"""The plugin's table of contents: every point where graft-vllm touches Graft's core.

Importing it is cheap: vLLM (and torch) load only when a run starts the engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from graft import hookimpl
from graft_vllm.config import SECTION, VLLMConfig, context_fits_the_model


@hookimpl
def graft_config_sections() -> list[tuple[str, type]]:
    """``features.vllm`` (``gpu_memory_utilization``, ``max_model_len``)."""
    return [(SECTION, VLLMConfig)]


@hookimpl
def graft_config_rules() -> list[Any]:
    """The engine's context fits the model (a default is lowered, a value set is checked)."""
    return [context_fits_the_model]


def build_vllm(*, cfg: Any, engine: Any, env: Any, run_dir: Path, tokenizer: Any) -> Any:
    """A vLLM engine on rank 0 whose weights are streamed from the trainer after every step."""
    from graft_vllm.rollout import VLLMRollout

    return VLLMRollout(engine.model, compute_dtype=engine.compute_dtype, cfg=cfg, env=env,
                       run_dir=run_dir, tokenizer=tokenizer)


@hookimpl
def graft_rollout_engines() -> dict[str, Any]:
    """``rollout.engine=vllm``."""
    return {"vllm": build_vllm}
