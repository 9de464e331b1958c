"""graft-vllm: the vLLM rollout engine (``rollout.engine=vllm``, entry point ``vllm``, config
section ``features.vllm``) and the sink that streams the trainer's weights into it.

Importing this package is cheap (no torch, no vLLM); the engine's names load on first access:
`VLLMRollout` (the rollout engine), `VLLMSink` (an export sink for a running ``vllm.LLM``),
`start_engine` / `shutdown_engine` (a ``vllm.LLM`` for a model directory, in this process or
its own), `routed_experts_unsupported` (why this vLLM cannot return routed experts here);
the delta export (``features.vllm.delta``): `DeltaTracker` (the exporter's filter), `DeltaEntry`
(changed rows of a tensor) and `StateDictDeltaSink` (a dict that applies them).
"""

from graft import lazy_attributes
from graft_vllm.config import VLLMConfig

__version__ = "0.1.0"

__all__ = ["DeltaEntry", "DeltaTracker", "StateDictDeltaSink", "VLLMConfig", "VLLMRollout",
           "VLLMSink", "__version__", "routed_experts_unsupported", "shutdown_engine",
           "start_engine"]

_LAZY = {
    **dict.fromkeys(["DeltaEntry", "DeltaTracker", "StateDictDeltaSink"], "graft_vllm.delta"),
    "VLLMRollout": "graft_vllm.rollout",
    "routed_experts_unsupported": "graft_vllm.rollout",
    "VLLMSink": "graft_vllm.sink",
    "start_engine": "graft_vllm.engine",
    "shutdown_engine": "graft_vllm.engine",
}


__getattr__ = lazy_attributes(__name__, _LAZY)
