"""GPU correctness of graft-offload: bit-identical to no offload, and no pinned allocation after step 1.

Each case builds Graft's own engine (`build_engine`: FSDP2 on a one-rank mesh, activation
checkpointing, bf16 compute with fp32 masters, ``engine.compile`` when compiled) three times:
no offload, no offload again (a control: is the baseline itself repeatable?) and
``features.offload.enabled=true`` through the installed plugin's ``graft_pre_shard`` hook. Each
runs 3 steps of SFT forward/backward (two micro-batches per step) and AdamW; the loss of every
step and every parameter's gradient before every optimizer step are compared with
``torch.equal``. The offload run also records its pinned allocations per step (the second and
third steps must allocate none) and its ``offload/*`` metrics.

Cases: the tiny Qwen3-MoE preset (4 layers) and a dense 4-block Llama (hidden 1024), each eager
and with ``engine.compile=true``. Deterministic algorithms on, eager attention (so that the
baseline itself is bit-repeatable), ``min_tensor_mb=0`` (the tiny MoE's block inputs are small).

    python bench/gpu/offload_check.py --out $OUT/offload_check.json   # one H200, ~60-90 s (2 compiles)
    python bench/gpu/offload_check.py --small      # CPU smoke test: stand-in backend, eager, no control
"""

from __future__ import annotations

import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS; before CUDA

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from contextlib import nullcontext  # noqa: E402

import torch  # noqa: E402

STEPS = 3
CASES = {  # name -> model overrides
    "tiny-qwen3-moe x4": ["model.preset=tiny-qwen3-moe", "+model.overrides.num_hidden_layers=4"],
    "dense llama x4": ["model.preset=tiny-llama", "+model.overrides.num_hidden_layers=4",
                       "+model.overrides.hidden_size=1024", "+model.overrides.intermediate_size=2816",
                       "+model.overrides.num_attention_heads=8",
                       "+model.overrides.num_key_value_heads=4", "+model.overrides.head_dim=128"],
}


def run(case: list[str], *, offload: bool, compiled: bool, tokens: int, device: torch.device) -> dict:
    """Three SFT steps of Graft's engine; losses, gradients and the offload's records."""
    from graft.config import compose
    from graft.engine.distributed import init_distributed
    from graft.engine.micro_batch import TokenSample
    from graft.engine.phase import SFT
    from graft.plugins import get_plugin_manager
    from graft.training.sft import sft_loss
    from graft.training.trainer import build_engine
    from graft_offload.patching import routed_offloader

    cfg = compose([*case, "trainer.mode=sft", f"engine.device={device.type}",
                   "engine.activation_checkpointing=true", f"engine.compile={str(compiled).lower()}",
                   "engine.pad_to_length=true", f"engine.pad_to_length_bucket={tokens}",
                   f"engine.max_tokens_per_micro_batch={tokens}",
                   "model.attn_implementation=eager", "optim.lr=1e-4",
                   f"features.offload.enabled={str(offload).lower()}",
                   "features.offload.min_tensor_mb=0"])
    engine = build_engine(cfg, init_distributed(device_preference=device.type), pad_token_id=0)
    generator = torch.Generator().manual_seed(0)
    samples = [TokenSample(torch.randint(3, 100, (tokens,), generator=generator).tolist(), 1)
               for _ in range(2)]
    batches = engine.micro_batches(samples)
    assert len(batches) == 2
    offloader = routed_offloader(engine.family.decoder_blocks(engine.model)[0])
    assert (offloader is not None) == offload
    hook = get_plugin_manager().hook
    record = {"losses": [], "grads": [], "metrics": [], "pinned_allocations": []}
    for step in range(1, STEPS + 1):
        hook.graft_step_begin(step=step)
        pending = engine.forward_backward(batches, sft_loss, loss_scale_factor=1.0, phase=SFT)
        record["grads"].append({n: _local(p.grad).detach().clone()
                                for n, p in engine.model.named_parameters() if p.grad is not None})
        engine.optimizer_step()
        record["losses"].append(pending.loss_total.item())
        metrics: dict[str, float] = {}
        hook.graft_step_end(step=step, metrics=metrics)
        record["metrics"].append({k: v for k, v in metrics.items() if k.startswith("offload/")})
        if offloader is not None:
            record["pinned_allocations"].append(offloader.pool.allocations)
            record["pinned_gib"] = offloader.pool.pinned_bytes / 2**30
    del engine, offloader
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return record


def _local(grad: torch.Tensor) -> torch.Tensor:
    return grad.to_local() if hasattr(grad, "to_local") else grad


def mismatches(expected: dict, got: dict) -> tuple[bool, list[str]]:
    """Whether every loss is equal, and the gradients (``step N: name``) that differ."""
    losses = expected["losses"] == got["losses"]
    differ = [f"step {i + 1}: {name}" for i, (want, have) in enumerate(zip(expected["grads"],
                                                                           got["grads"], strict=True))
              for name in want if name not in have or not torch.equal(want[name], have[name])]
    return losses, differ


def check_case(name: str, case: list[str], *, compiled: bool, tokens: int,
               device: torch.device, control: bool = True) -> dict:
    """No offload, the control (no offload again, unless ``control`` is False), offload."""
    started = time.perf_counter()
    base = run(case, offload=False, compiled=compiled, tokens=tokens, device=device)
    again = run(case, offload=False, compiled=compiled, tokens=tokens, device=device) \
        if control else base
    offload = run(case, offload=True, compiled=compiled, tokens=tokens, device=device)
    control_losses, control_grads = mismatches(base, again)
    same_losses, differ = mismatches(base, offload)
    allocations = offload["pinned_allocations"]
    return {
        "case": name, "compiled": compiled, "tokens_per_micro_batch": tokens, "steps": STEPS,
        "parameters_compared": len(base["grads"][0]),
        "losses": base["losses"], "offload_losses": offload["losses"],
        "identical_losses": same_losses, "identical_grads": not differ, "differing": differ[:20],
        "control_repeatable": (control_losses and not control_grads) if control else None,
        "pinned_allocations_per_step": allocations,
        "no_new_pinned_after_step_1": len(set(allocations)) == 1,
        "pinned_gib": offload.get("pinned_gib"), "metrics": offload["metrics"],
        "seconds": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true",
                        help="CPU, the stand-in copy backend, eager only (a few seconds)")
    parser.add_argument("--out", default=None, help="write the results here (JSON)")
    args = parser.parse_args()
    torch.use_deterministic_algorithms(True, warn_only=True)
    for key in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, key):  # one compiled graph per model class and build
            setattr(torch._dynamo.config, key, 256)
    device = torch.device("cpu" if args.small else "cuda")
    from graft_offload.runtime import use_copy_backend
    from graft_offload.standin import DeferredCopyBackend

    context = use_copy_backend(DeferredCopyBackend) if args.small else nullcontext()
    rows = []
    with context:
        for compiled in ((False,) if args.small else (False, True)):
            for name, case in CASES.items():
                tokens = 64 if args.small else (2048 if "dense" in name else 1024)
                small = ["+model.overrides.hidden_size=64", "+model.overrides.intermediate_size=128",
                         "+model.overrides.head_dim=16"] if args.small and "dense" in name else []
                try:
                    rows.append(check_case(name, case + small, compiled=compiled, tokens=tokens,
                                           device=device, control=not args.small))
                except Exception as exc:  # noqa: BLE001 - one failing case must not hide the rest
                    traceback.print_exc()
                    rows.append({"case": name, "compiled": compiled,
                                 "error": f"{type(exc).__name__}: {exc}"[:2000]})
                print(json.dumps({k: rows[-1].get(k) for k in (
                    "case", "compiled", "identical_losses", "identical_grads", "error")}), flush=True)
    result = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
              "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (stand-in)",
              "all_identical": all(r.get("identical_losses") and r.get("identical_grads")
                                   for r in rows),
              "cases": rows}
    print(f"{'case':<20} {'compile':>7} {'losses':>7} {'grads':>6} {'control':>7} "
          f"{'pinned allocs/step':>18} {'host GiB':>8} {'s':>5}")
    for r in rows:
        if "error" in r:
            print(f"{r['case']:<20} {str(r['compiled']):>7} ERROR {r['error'][:80]}")
            continue
        host = r["metrics"][-1].get("offload/host_gb", 0.0)
        print(f"{r['case']:<20} {str(r['compiled']):>7} {_mark(r['identical_losses']):>7} "
              f"{_mark(r['identical_grads']):>6} {_mark(r['control_repeatable']):>7} "
              f"{str(r['pinned_allocations_per_step']):>18} {host:>8.4f} {r['seconds']:>5}")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=2)
    from graft.engine.distributed import shutdown_distributed

    shutdown_distributed()


def _mark(ok: bool | None) -> str:
    return "-" if ok is None else "equal" if ok else "DIFF"


if __name__ == "__main__":
    main()
