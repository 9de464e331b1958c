"""GPU correctness of graft-offload on a model loaded from disk: bit-identical to no offload, and
pinned host memory never above ``host_cache_limit_gb``.

Every model is first saved as a Hugging Face directory and trained from it (``model.path``), as
users do: Graft's engine (`build_engine`) builds it on the meta device, shards it with FSDP2 (a
one-rank mesh), fills it from the checkpoint, with activation checkpointing and bf16 compute
over fp32 masters; the plugin's ``graft_pre_shard`` sees the model on meta.

* ``identity`` (tiny Qwen3-MoE x4 and a dense 4-block Llama of hidden 1024, eager and with
  ``engine.compile=true``): three runs of 3 SFT steps (two micro-batches each) and AdamW: no
  offload, no offload again (a control: is the baseline itself repeatable?) and
  ``features.offload.enabled=true``; every step's loss and every gradient compared with
  ``torch.equal``; the offload run must report its metrics every step (it ran) and pin nothing
  new after step 1.
* ``ceiling`` (the dense Llama, eager): 5 steps of varying lengths (the longest would need more
  host memory than the ceiling, so buffers are evicted and inputs kept on the GPU), no offload
  and offload, bit-identical. Pinned bytes are measured three ways after every step: the pool's
  own count; the bytes really page-locked through ``cudaHostRegister`` (a counting wrapper
  around ``torch.cuda.cudart()``, its running peak over the whole run); PyTorch's caching host
  allocator (``torch.cuda.host_memory_stats``: the offload must not pin anything there, so its
  peak stays at the no-offload run's). The process's VmRSS / VmLck / VmPin (``/proc/self/
  status``) are recorded each step and after the pool is closed, for the record. Passes when no
  measure exceeds the ceiling and nothing is registered after the pool is closed.

Deterministic algorithms on, eager attention (so that the baseline itself is bit-repeatable),
``min_tensor_mb=0`` (the tiny MoE's block inputs are small).

    python bench/gpu/offload_check.py --out $OUT/offload_check.json     # one H200, ~2 min
    python bench/gpu/offload_check.py --small --out /tmp/offload_check.json  # CPU: stand-in copy
                                                                             # backend, eager, small
"""

from __future__ import annotations

import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS; before CUDA

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

STEPS = 3
CASES = {  # name -> (preset, model overrides)
    "tiny-qwen3-moe x4": ("tiny-qwen3-moe", {"num_hidden_layers": 4}),
    "dense llama x4": ("tiny-llama", {"num_hidden_layers": 4, "hidden_size": 1024,
                                      "intermediate_size": 2816, "num_attention_heads": 8,
                                      "num_key_value_heads": 4, "head_dim": 128}),
}
SMALL_DENSE = {"hidden_size": 64, "intermediate_size": 128, "head_dim": 16}
CEILING_CASE = "dense llama x4"
CEILING_LENGTHS = (2048, 8192, 4096, 6144, 1024)  # tokens per sample, one step each (GPU)
SMALL_LENGTHS = (64, 256, 128, 192, 32)
CEILING_FRACTION = 2.5  # the ceiling holds this many block inputs of the longest step


class CountingRegistry:
    """``torch.cuda.cudart()``'s host registration calls, counted: the bytes the process really
    page-locks through the offload (current, and the peak since creation)."""

    def __init__(self, cudart: Any) -> None:
        self.cudart = cudart
        self.sizes: dict[int, int] = {}
        self.current = self.peak = 0

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> Any:  # noqa: N802
        error = self.cudart.cudaHostRegister(ptr, size, flags)
        if int(error) == 0:
            self.sizes[ptr] = size
            self.current += size
            self.peak = max(self.peak, self.current)
        return error

    def cudaHostUnregister(self, ptr: int) -> Any:  # noqa: N802
        error = self.cudart.cudaHostUnregister(ptr)
        if int(error) == 0:
            self.current -= self.sizes.pop(ptr, 0)
        return error

    def cudaGetErrorString(self, error: Any) -> str:  # noqa: N802
        return self.cudart.cudaGetErrorString(error)

    def reset_peak(self) -> None:
        """Start a new peak from what is registered now."""
        self.peak = self.current


def save_hf_dir(preset: str, overrides: dict, root: Path) -> Path:
    """``preset`` with ``overrides`` saved as a Hugging Face directory (weights and tokenizer)."""
    from graft.config import ModelConfig
    from graft.data.tokenizer import load_tokenizer
    from graft.models import build_model

    folder = root / f"{preset}-{len(os.listdir(root))}"
    model, _ = build_model(ModelConfig(preset=preset, overrides=dict(overrides)), seed=3)
    model.save_pretrained(folder)
    load_tokenizer(None, None).save_pretrained(folder)
    return folder


def process_memory_kib() -> dict[str, int]:
    """VmRSS, VmLck and VmPin of this process (KiB; empty where /proc is not there)."""
    try:
        lines = Path("/proc/self/status").read_text().splitlines()
    except OSError:
        return {}
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    return {key: int(fields[key].split()[0]) for key in ("VmRSS", "VmLck", "VmPin") if key in fields}


def host_allocator_bytes(device: torch.device) -> dict[str, int]:
    """PyTorch's caching host (pinned) allocator: bytes it holds now and its peak."""
    if device.type != "cuda" or not hasattr(torch.cuda, "host_memory_stats"):
        return {}
    stats = torch.cuda.host_memory_stats()
    return {"current": int(stats.get("allocated_bytes.current", 0)),
            "peak": int(stats.get("allocated_bytes.peak", 0))}


def run(hf_dir: Path, *, offload: bool, compiled: bool, lengths: list[int], bucket: int,
        device: torch.device, limit_gb: float | None = None,
        registry: CountingRegistry | None = None) -> dict:
    """SFT steps of Graft's engine on the model at ``hf_dir``, two samples of ``lengths[i]``
    tokens in step ``i``; losses, gradients and the offload's records."""
    from graft.config import compose
    from graft.engine.batch.micro_batch import TokenSample
    from graft.engine.distributed.env import init_distributed
    from graft.engine.phase import SFT
    from graft.plugins import get_plugin_manager
    from graft.training.sft import sft_loss
    from graft.training.trainer import build_engine
    from graft_offload.patching import routed_offloader
    from graft_offload.runtime import remove_offload

    cfg = compose([f"model.path={hf_dir}", "trainer.mode=sft", f"engine.device={device.type}",
                   f"trainer.total_steps={len(lengths)}",
                   "engine.activation_checkpointing=true", f"engine.compile={str(compiled).lower()}",
                   "engine.pad_to_length=true", f"engine.pad_to_length_bucket={bucket}",
                   f"engine.max_tokens_per_micro_batch={max(lengths)}",
                   "model.attn_implementation=eager", "optim.lr=1e-4",
                   f"features.offload.enabled={str(offload).lower()}",
                   "features.offload.min_tensor_mb=0",
                   *([f"features.offload.host_cache_limit_gb={limit_gb}"] if limit_gb else [])])
    if device.type == "cuda" and hasattr(torch.cuda, "reset_peak_host_memory_stats"):
        torch.cuda.reset_peak_host_memory_stats()
    engine = build_engine(cfg, init_distributed(device_preference=device.type), pad_token_id=0)
    blocks = list(engine.family.decoder_blocks(engine.model))
    offloader = routed_offloader(blocks[0])
    assert (offloader is not None) == offload
    hook = get_plugin_manager().hook
    generator = torch.Generator().manual_seed(0)
    record: dict[str, Any] = {"losses": [], "grads": [], "metrics": [], "pinned_allocations": [],
                              "memory": []}
    for step, tokens in enumerate(lengths, start=1):
        samples = [TokenSample(torch.randint(3, 100, (tokens,), generator=generator).tolist(), 1)
                   for _ in range(2)]
        hook.graft_step_begin(step=step)
        pending = engine.forward_backward(engine.micro_batches(samples), sft_loss,
                                          loss_scale_factor=1.0, phase=SFT)
        record["grads"].append({n: _local(p.grad).detach().clone()
                                for n, p in engine.model.named_parameters() if p.grad is not None})
        engine.optimizer_step()
        record["losses"].append(pending.loss_total.item())
        metrics: dict[str, float] = {}
        hook.graft_step_end(step=step, metrics=metrics)
        record["metrics"].append({k: v for k, v in metrics.items() if k.startswith("offload/")})
        record["memory"].append(memory_now(offloader, registry, device))
        if offloader is not None:
            record["pinned_allocations"].append(offloader.pool.allocations)
    if offloader is not None:
        remove_offload(blocks, offloader)  # closes the pool: every idle buffer freed
        record["after_close"] = memory_now(offloader, registry, device)
    del engine, offloader
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return record


def memory_now(offloader: Any, registry: CountingRegistry | None, device: torch.device) -> dict:
    """Pinned bytes as the pool counts them, as CUDA registered them, as PyTorch's host
    allocator holds them; the process's memory."""
    row: dict[str, Any] = {"process_kib": process_memory_kib(),
                           "host_allocator": host_allocator_bytes(device)}
    if offloader is not None:
        row["pool_pinned"] = offloader.pool.pinned_bytes
        row["pool_held"] = offloader.pool.held_bytes
    if registry is not None:
        row["registered"], row["registered_peak"] = registry.current, registry.peak
    return row


def _local(grad: torch.Tensor) -> torch.Tensor:
    return grad.to_local() if hasattr(grad, "to_local") else grad


def mismatches(expected: dict, got: dict) -> tuple[bool, list[str]]:
    """Whether every loss is equal, and the gradients (``step N: name``) that differ."""
    losses = expected["losses"] == got["losses"]
    differ = [f"step {i + 1}: {name}" for i, (want, have) in enumerate(zip(expected["grads"],
                                                                           got["grads"], strict=True))
              for name in want if name not in have or not torch.equal(want[name], have[name])]
    return losses, differ


def check_identity(name: str, hf_dir: Path, *, compiled: bool, tokens: int,
                   device: torch.device, control: bool = True) -> dict:
    """No offload, the control (no offload again, unless ``control`` is False), offload."""
    started = time.perf_counter()
    lengths = [tokens] * STEPS
    common = dict(compiled=compiled, lengths=lengths, bucket=tokens, device=device)
    base = run(hf_dir, offload=False, **common)
    again = run(hf_dir, offload=False, **common) if control else base
    offload = run(hf_dir, offload=True, **common)
    control_losses, control_grads = mismatches(base, again)
    same_losses, differ = mismatches(base, offload)
    allocations = offload["pinned_allocations"]
    return {
        "check": "identity", "case": name, "source": "model.path", "compiled": compiled,
        "tokens_per_micro_batch": tokens, "steps": STEPS,
        "parameters_compared": len(base["grads"][0]),
        "losses": base["losses"], "offload_losses": offload["losses"],
        "identical_losses": same_losses, "identical_grads": not differ, "differing": differ[:20],
        "control_repeatable": (control_losses and not control_grads) if control else None,
        "offload_ran_every_step": all(m.get("offload/offloaded_gb", 0) > 0
                                      for m in offload["metrics"]),
        "pinned_allocations_per_step": allocations,
        "no_new_pinned_after_step_1": len(set(allocations)) == 1,
        "metrics": offload["metrics"], "seconds": round(time.perf_counter() - started, 1),
    }


def check_ceiling(hf_dir: Path, *, hidden: int, lengths: tuple[int, ...], bucket: int,
                  device: torch.device, registry: CountingRegistry | None) -> dict:
    """5 steps of varying lengths under a ceiling the longest step overflows."""
    started = time.perf_counter()
    input_bytes = max(lengths) * hidden * (2 if device.type == "cuda" else 4)  # bf16 / fp32
    limit = int(CEILING_FRACTION * input_bytes) // 4096 * 4096
    limit_gb = limit / 2**30
    common = dict(compiled=False, lengths=list(lengths), bucket=bucket, device=device)
    base = run(hf_dir, offload=False, **common)
    if registry is not None:
        registry.reset_peak()
    offload = run(hf_dir, offload=True, limit_gb=limit_gb, registry=registry, **common)
    same_losses, differ = mismatches(base, offload)
    steps = offload["memory"]
    pool_peak = max(m["pool_pinned"] for m in steps)
    registered_peak = registry.peak if registry is not None else None
    base_host_peak = max((m["host_allocator"].get("peak", 0) for m in base["memory"]), default=0)
    host_peak = max((m["host_allocator"].get("peak", 0) for m in steps), default=0)
    closed = offload["after_close"]
    held = (pool_peak <= limit and (registered_peak is None or registered_peak <= limit)
            and host_peak <= base_host_peak and closed["pool_pinned"] == 0
            and closed.get("registered", 0) == 0)
    return {
        "check": "ceiling", "case": CEILING_CASE, "source": "model.path", "lengths": list(lengths),
        "limit_bytes": limit, "host_cache_limit_gb": limit_gb,
        "identical_losses": same_losses, "identical_grads": not differ, "differing": differ[:20],
        "kept_on_gpu_blocks": [m.get("offload/kept_on_gpu_blocks") for m in offload["metrics"]],
        "pool_pinned_peak": pool_peak, "registered_peak": registered_peak,
        "host_allocator_peak": host_peak, "host_allocator_peak_without_offload": base_host_peak,
        "ceiling_held": held, "per_step": steps, "after_close": closed,
        "process_kib_without_offload": [m["process_kib"] for m in base["memory"]],
        "metrics": offload["metrics"], "seconds": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true",
                        help="CPU, the stand-in copy backend, eager only, small shapes")
    parser.add_argument("--out", required=True, help="write the results here (JSON)")
    args = parser.parse_args()
    torch.use_deterministic_algorithms(True, warn_only=True)
    for key in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, key):  # one compiled graph per model class and build
            setattr(torch._dynamo.config, key, 256)
    device = torch.device("cpu" if args.small else "cuda")
    from graft_offload.backend import CudaCopyBackend
    from graft_offload.runtime import use_copy_backend
    from graft_offload.standin import DeferredCopyBackend

    registry = None if args.small else CountingRegistry(torch.cuda.cudart())
    factory = DeferredCopyBackend if args.small else (lambda: CudaCopyBackend(registry))
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp, use_copy_backend(factory):
        dirs = {name: save_hf_dir(preset, {**overrides, **(SMALL_DENSE if args.small
                                                           and "dense" in name else {})},
                                  Path(tmp))
                for name, (preset, overrides) in CASES.items()}
        for compiled in ((False,) if args.small else (False, True)):
            for name in CASES:
                tokens = 64 if args.small else (2048 if "dense" in name else 1024)
                rows.append(guarded(lambda: check_identity(
                    name, dirs[name], compiled=compiled, tokens=tokens, device=device,
                    control=not args.small), check="identity", case=name, compiled=compiled))
        hidden = (SMALL_DENSE if args.small else CASES[CEILING_CASE][1])["hidden_size"]
        rows.append(guarded(lambda: check_ceiling(
            dirs[CEILING_CASE], hidden=hidden, lengths=SMALL_LENGTHS if args.small
            else CEILING_LENGTHS, bucket=32 if args.small else 1024, device=device,
            registry=registry), check="ceiling", case=CEILING_CASE))
    result = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
              "transformers": _transformers_version(),
              "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (stand-in)",
              "all_identical": all(r.get("identical_losses") and r.get("identical_grads")
                                   for r in rows),
              "all_ran": all(r.get("offload_ran_every_step", True) and "error" not in r
                             for r in rows),
              "ceiling_held": all(r.get("ceiling_held") for r in rows if r["check"] == "ceiling"),
              "checks": rows}
    print_table(rows)
    Path(args.out).write_text(json.dumps(result, indent=2))
    from graft.engine.distributed.env import shutdown_distributed

    shutdown_distributed()


def guarded(measure: Any, **row: Any) -> dict:
    """``measure()``'s row, or ``row`` with the error: one failing check must not hide the rest."""
    try:
        result = measure()
    except Exception as exc:  # noqa: BLE001
        traceback.print_exc()
        result = {**row, "error": f"{type(exc).__name__}: {exc}"[:2000]}
    print(json.dumps({k: result.get(k) for k in ("check", "case", "compiled", "identical_losses",
                                                  "identical_grads", "ceiling_held", "error")}),
          flush=True)
    return result


def print_table(rows: list[dict]) -> None:
    print(f"{'check':<9} {'case':<20} {'compile':>7} {'losses':>7} {'grads':>6} {'control':>7} "
          f"{'pinned allocs/step':>18} {'ceiling':>7} {'s':>5}")
    for r in rows:
        head = f"{r['check']:<9} {r['case']:<20} {str(r.get('compiled', False)):>7}"
        if "error" in r:
            print(f"{head} ERROR {r['error'][:80]}")
            continue
        print(f"{head} {_mark(r['identical_losses']):>7} {_mark(r['identical_grads']):>6} "
              f"{_mark(r.get('control_repeatable')):>7} "
              f"{str(r.get('pinned_allocations_per_step', '')):>18} "
              f"{_held(r.get('ceiling_held')):>7} {r['seconds']:>5}")


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def _mark(ok: bool | None) -> str:
    return "-" if ok is None else "equal" if ok else "DIFF"


def _held(ok: bool | None) -> str:
    return "-" if ok is None else "held" if ok else "OVER"


if __name__ == "__main__":
    main()
