"""graft-vllm: the vLLM rollout engine (``rollout.engine=vllm``, entry point ``vllm``, config
section ``features.vllm``) and the sink that streams the trainer's weights into it.

Importing this package is cheap (no torch, no vLLM); the engine's names load on first access:
`VLLMRollout` (the rollout engine), `VLLMSink` (an export sink for a running ``vllm.LLM``),
`start_engine` / `shutdown_engine` (a ``vllm.LLM`` for a model directory, in this process or
its own), `routed_experts_unsupported` (why this vLLM cannot return routed experts here).
"""

from typing import Any

from graft_vllm.config import VLLMConfig

__version__ = "0.1.0"

__all__ = ["VLLMConfig", "VLLMRollout", "VLLMSink", "__version__", "routed_experts_unsupported",
           "shutdown_engine", "start_engine"]

_LAZY = {
    "VLLMRollout": "graft_vllm.rollout",
    "routed_experts_unsupported": "graft_vllm.rollout",
    "VLLMSink": "graft_vllm.sink",
    "start_engine": "graft_vllm.engine",
    "shutdown_engine": "graft_vllm.engine",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'graft_vllm' has no attribute {name!r}")
