"""GPT-OSS with graft-gpt-oss on one GPU: an SFT step against a plain FSDP2 loop, then weight
export streamed per expert, in one run.

Model: GPT-OSS-20B shapes (hidden 2880, 32 experts of MLP 2880 with top-4, 64 heads / 8 KV of 64,
vocab 201088; `export.GPT_OSS_20B`) with ``--layers`` of its 24 layers, random weights, fp32
master weights, bf16 compute with fp32 gradient reduction, flex attention (GPT-OSS's sinks;
transformers has no SDPA path for them), one ``--tokens`` sequence per step, EP=1.

1. SFT step (forward, backward, AdamW), ``--warmup`` steps then the mean of ``--steps``:
   * plain: transformers model, ``fully_shard`` per block and root, fused AdamW, the experts on
     transformers' fastest implementation (``grouped_mm``), HF's own loss, gradients clipped at
     norm 1.0 (``clip_grad_norm_``, as HF Trainer, TRL and torchtitan do by default). No Graft
     code.
   * graft: Graft's engine exactly as ``graft train`` builds it with this plugin (same experts
     implementation and attention), gradients clipped at norm 1.0 (Graft's default).
   Model TFLOP/s count active parameters (experts x top_k / num_experts, no embedding lookup):
   6 N_active S, plus attention 6 h S^2 per full-attention layer and 12 h S W per
   sliding-window layer (h = heads x head dim, W the window).
2. Export of the trained model (the graft variant's) in bf16 (the RL sync: fp32 masters cast on
   the fly) and in fp32 (a pure copy): to a device-side sink and to pinned host, in vLLM's layout
   (one tensor per expert, ``...experts.<id>.gate_up_proj`` [H, 2I]) and, for reference, in
   transformers' fused layout; GB/s of exported bytes against a device copy and a pinned
   device-to-host copy of 4 GiB measured in the same run (`export.copy_rates`), and the peak
   extra device memory (bound: one bucket plus the largest parameter in the export dtype).
   A bf16 export to a device sink reads the fp32 masters: it is measured against a 4 GiB fp32 ->
   bf16 cast, an fp32 one against a plain copy, exports to the host against the pinned D2H copy.

    python3 bench/gpt_oss.py --out $OUT/gpt_oss.json     # one H200, about 2 minutes
    python3 bench/gpt_oss.py --small                     # CPU smoke test (tiny shapes, seconds)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch
from timing import release, timed

sys.path.insert(0, str(Path(__file__).resolve().parent))
import export as export_bench  # noqa: E402  (bench/export.py: rates, timing, hand-off sink)

GPT_OSS_20B = export_bench.GPT_OSS_20B
SMALL = {"hidden_size": 64, "intermediate_size": 64, "num_local_experts": 8,
         "num_experts_per_tok": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 32, "vocab_size": 128, "sliding_window": 64}


def shapes_for(args: argparse.Namespace) -> dict[str, Any]:
    """The model's HF config fields: GPT-OSS-20B's (or tiny ones) with ``--layers`` layers."""
    return {**(SMALL if args.small else GPT_OSS_20B), "num_hidden_layers": args.layers}


def active_params(model: torch.nn.Module, config: Any) -> int:
    """Parameters one token multiplies with: experts count top_k / num_experts of theirs; the
    embedding table (a lookup) does not count."""
    share = config.num_experts_per_tok / config.num_local_experts
    total = 0.0
    for name, param in model.named_parameters():
        if "embed_tokens" in name:
            continue
        total += param.numel() * (share if ".mlp.experts." in name else 1.0)
    return int(total)


def model_flops(n_active: int, config: Any, tokens: int) -> float:
    """Forward + backward FLOPs of one step over one sequence of ``tokens``."""
    width = config.num_attention_heads * config.head_dim
    full = sum(t == "full_attention" for t in config.layer_types)
    sliding = len(config.layer_types) - full
    window = min(config.sliding_window, tokens)
    return (6 * n_active * tokens + 6 * full * width * tokens**2
            + 12 * sliding * width * tokens * window)


def gpt_oss_config(shapes: dict[str, Any]) -> Any:
    """The HF config both variants build: the plugin's preset with ``shapes``."""
    from graft_gpt_oss.family import tiny_gpt_oss

    return tiny_gpt_oss(**shapes)


def plain_loop(shapes: dict[str, Any], tokens: int, device: torch.device, attn: str | None):
    """The peer: HF model, fully_shard, fused AdamW, HF loss, grouped_mm experts."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import AutoModelForCausalLM

    config = gpt_oss_config(shapes)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                                 **({"attn_implementation": attn} if attn else {}))
    model.set_experts_implementation("grouped_mm")
    model.config.use_cache = False
    bf16 = device.type == "cuda"
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else None,
                                  reduce_dtype=torch.float32 if bf16 else None)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=bf16)
    ids = torch.randint(3, shapes["vocab_size"], (1, tokens), device=device)

    def step() -> None:
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return model, step


def graft_engine(shapes: dict[str, Any], tokens: int, device: torch.device, attn: str | None, *,
                 ep: int = 1, compile_blocks: bool = False):
    """Graft's engine as ``graft train`` builds it (``engine.ep_size=ep``), one SFT step."""
    from graft.config import compose
    from graft.engine.batch.micro_batch import TokenSample
    from graft.engine.distributed.env import init_distributed
    from graft.engine.phase import SFT
    from graft.training.sft import sft_loss
    from graft.training.trainer import build_engine

    overrides = ["model.preset=tiny-gpt-oss", f"engine.device={device.type}", "trainer.mode=sft",
                 f"engine.ep_size={ep}", f"engine.compile={str(compile_blocks).lower()}",
                 f"engine.max_tokens_per_micro_batch={tokens}", "optim.lr=1e-5",
                 "optim.max_grad_norm=1.0", "model.experts_implementation=grouped_mm",
                 *([f"model.attn_implementation={attn}"] if attn else []),
                 *[f"+model.overrides.{key}={value}" for key, value in shapes.items()]]
    cfg = compose(overrides)
    env = init_distributed(device_preference=device.type, ep_size=ep)
    engine = build_engine(cfg, env, pad_token_id=0)
    generator = torch.Generator().manual_seed(env.rank)
    sample = TokenSample(torch.randint(3, shapes["vocab_size"], (tokens,),
                                       generator=generator).tolist(), response_start=1)
    batches = engine.micro_batches([sample])

    def step() -> None:
        engine.forward_backward(batches, sft_loss, loss_scale_factor=1.0, phase=SFT)
        engine.optimizer_step()

    return engine.model, step








def measure_step(name: str, build, shapes: dict[str, Any], tokens: int, args, device) -> tuple[dict, Any]:
    """Build a variant, time its steps; returns its row and its model."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    model, step = build()
    config = model.config
    seconds = timed(step, warmup=args.warmup, steps=args.steps, device=device)
    n_active = active_params(model, config)
    row = {"variant": name, "step_s": round(seconds, 4), "tokens_per_s": round(tokens / seconds),
           "model_tflops": round(model_flops(n_active, config, tokens) / seconds / 1e12, 1),
           "peak_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 1)
           if device.type == "cuda" else 0.0,
           "params": sum(p.numel() for p in model.parameters()), "active_params": n_active}
    print(json.dumps(row), flush=True)
    return row, model


class PerExpertSink(export_bench.HandoffSink):
    """The hand-off sink of bench/export.py, in vLLM's layout (GPT-OSS experts one by one)."""

    consumer = "vllm"


def export_rows(model: torch.nn.Module, device: torch.device, args) -> list[dict]:
    """Exports of ``model`` (bf16 and fp32; per expert and fused; device and pinned host)."""
    from graft.export.stream import WeightExporter

    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        model_bytes = sum(p.numel() for p in model.parameters()) * dtype.itemsize
        largest = max(p.numel() for p in model.parameters()) * dtype.itemsize
        # A tensor larger than the bucket is handed to the sink as it is, with no copy (the
        # fp32 embedding and head, 2.3 GB each, over 2 GiB): a bucket that holds the largest
        # one makes every byte a copy, so the rates compare with the copy rates.
        bucket = max((1 if args.small else args.bucket_mb) << 20, largest)
        for layout, sink_class in (("per expert", PerExpertSink), ("fused", export_bench.HandoffSink)):
            for target, bucket_device in (("device sink", device), ("pinned host",
                                                                     torch.device("cpu"))):
                if device.type == "cpu" and target == "pinned host":
                    continue
                exporter = WeightExporter(model, bucket_bytes=bucket, dtype=dtype,
                                          is_main=True, bucket_device=bucket_device)
                sink = sink_class()
                seconds, peak, repeats = export_bench.measure(
                    lambda exporter=exporter, sink=sink: partial(exporter.export, sink),
                    args.repeats)
                row = {"variant": f"graft -> {target} ({layout}, {str(dtype)[6:]})",
                       "dtype": str(dtype)[6:], "layout": layout, "target": target,
                       "seconds": round(seconds, 4), "repeats": repeats,
                       "gb_per_s": round(model_bytes / seconds / 1e9, 1),
                       "peak_extra_gib": round(peak, 2),
                       "bound_gib": round((bucket + largest) / 2**30, 2)}
                print(json.dumps(row), flush=True)
                rows.append(row)
                del exporter, sink
                release(device)
    return rows


def cast_rate(device: torch.device, nbytes: int, repeats: int) -> float:
    """GB/s of one large fp32 -> bf16 cast on ``device``, in bf16 bytes written: the reference
    for a bf16 export of fp32 masters, which reads two bytes for each one it writes (a plain
    copy reads one)."""
    source = torch.empty(nbytes // 2, dtype=torch.float32, device=device).uniform_()
    target = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device)
    seconds, _, _ = export_bench.measure(lambda: lambda: target.copy_(source), repeats)
    return nbytes / seconds / 1e9


def reference_rate(row: dict, rates: dict) -> float | None:
    """What an export row is measured against: pinned D2H to the host; on the device a cast
    for bf16 (from the fp32 masters), a plain copy for fp32."""
    if row["target"] == "pinned host":
        return rates.get("d2h_pinned_gb_per_s")
    return rates["device_cast_gb_per_s" if row["dtype"] == "bfloat16" else "device_copy_gb_per_s"]


def report(result: dict, out: str | None) -> None:
    """Print the tables and write the JSON."""
    print(f"{'variant':<24} {'tokens/s':>9} {'TFLOP/s':>8} {'step s':>7} {'peak GiB':>9}")
    for r in result["steps"]:
        print(f"{r['variant']:<24} {r['tokens_per_s']:>9} {r['model_tflops']:>8} "
              f"{r['step_s']:>7} {r['peak_gib']:>9}")
    rates = result["rates"]
    d2h = rates.get("d2h_pinned_gb_per_s")
    print(f"device copy {rates['device_copy_gb_per_s']:.0f} GB/s, fp32 -> bf16 cast "
          f"{rates['device_cast_gb_per_s']:.0f} GB/s" + (f", pinned D2H {d2h:.1f} GB/s" if d2h else ""))
    print(f"{'export':<48} {'GB/s':>8} {'% of ref':>9} {'s':>8} {'peak GiB':>9} {'bound':>6}")
    for r in result["exports"]:
        reference = reference_rate(r, rates)
        r["of_reference_pct"] = round(100 * r["gb_per_s"] / reference, 1) if reference else None
        share = f"{r['of_reference_pct']:.0f}%" if reference else "-"
        print(f"{r['variant']:<48} {r['gb_per_s']:>8} {share:>9} {r['seconds']:>8} "
              f"{r['peak_extra_gib']:>9} {r['bound_gib']:>6}")
    if out:
        Path(out).write_text(json.dumps(result, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny shapes on CPU (smoke test)")
    parser.add_argument("--layers", type=int, default=None, help="default 4 (2 with --small)")
    parser.add_argument("--tokens", type=int, default=None, help="default 8192 (128 with --small)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=10, help="timed exports per variant")
    parser.add_argument("--bucket-mb", type=int, default=2048)
    parser.add_argument("--variants", default="plain,graft",
                        help="plain, graft, graft-compile; exports use the last graft variant")
    parser.add_argument("--attn", default="flex_attention",
                        help="attention backend on GPU (eager also has sinks; CPU: eager)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    args.layers = args.layers or (2 if args.small else 4)
    tokens = args.tokens or (128 if args.small else 8192)
    device = torch.device("cpu" if args.small else "cuda")
    attn = None if args.small else args.attn  # flex attention runs sinks on CUDA only
    import transformers

    from graft.engine.distributed.env import init_distributed

    init_distributed(device_preference=device.type)  # one process group for every variant
    shapes = shapes_for(args)
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "world_size": 1, "ep_size": 1, "tokens": tokens, "shapes": shapes, "steps": []}
    graft_model = None  # the last graft variant's model: what the export part exports
    for variant in args.variants.split(","):
        graft_model = None
        release(device)
        if variant == "plain":
            build = partial(plain_loop, shapes, tokens, device, attn)
        else:
            build = partial(graft_engine, shapes, tokens, device, attn,
                            compile_blocks=variant == "graft-compile")
        row, built = measure_step(variant, build, shapes, tokens, args, device)
        result["steps"].append(row)
        if variant.startswith("graft"):
            graft_model = built
        del built
    release(device)
    reference_bytes = (4 << 30) if device.type == "cuda" else (64 << 20)
    result["rates"] = export_bench.copy_rates(device, reference_bytes, args.repeats)
    result["rates"]["device_cast_gb_per_s"] = cast_rate(device, reference_bytes, args.repeats)
    result["exports"] = export_rows(graft_model, device, args) if graft_model is not None else []
    report(result, args.out)


if __name__ == "__main__":
    main()
