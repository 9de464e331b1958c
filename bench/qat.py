"""DeepSeek-V4 QAT on one GPU (issue 15): step-time overhead against BF16, and the cost of one GEMM.

1. Per GEMM (x: M x K activations, w: N x K weight; default 8192 x 7168 x 7168), bf16 inputs:
   bf16 matmul; eager fake quant of W (128x128) and A (1x128) + matmul (the PyTorch reference);
   the same with the fused Triton kernels; Triton fake quant of A only + matmul (what QAT runs
   per forward: weights are fake-quantised once per optimizer step); ``F.scaled_mm`` with
   BlockWise1x128 x BlockWise128x128 scales, on pre-quantised operands and including the
   activation quantisation; and how far the real FP8 GEMM is from the fake-quant forward on the
   same tiles (relative to the output's mean / max magnitude).
2. Training step (forward, backward, AdamW) through Graft's engine: DeepSeek-V4-Flash shapes
   (transformers' DeepseekV4Config defaults: hidden 4096, 64 heads of 512, q rank 1024, 8 output
   groups of rank 1024, experts of 2048, top-6, indexer 64 x 128, hc_mult 4) with 4 layers
   (CSA, HCA, CSA, HCA; the first MoE hash-routed) and 16 routed experts, FP4 experts as in
   V4-Flash, one 4096-token sequence per step, FSDP2 on one GPU with bf16 compute and fp32
   masters. Variants: bf16 (qat=none), QAT with the PyTorch quantisers, with the Triton kernels,
   and ``qat=fp8_blockwise_gemm`` (Triton + real FP8 GEMMs for the linear layers), one run; for
   each, the time of one step's weight quantisation ("weight q s": every quantised weight of the
   model, which one GPU pays per optimizer step; FSDP2 over N GPUs divides it by N).

    python bench/qat.py --out $OUT/qat.json        # one H200: ~2 min including Triton compiles
    python bench/qat.py --small                    # CPU smoke test (tiny shapes, PyTorch only)
"""

from __future__ import annotations

import argparse
import gc
import json
import time

import torch
from timing import timed

STEP_LAYERS = ["compressed_sparse_attention", "heavily_compressed_attention"] * 2
V4_FIELDS = ("hidden_size", "moe_intermediate_size", "num_attention_heads", "num_key_value_heads",
             "head_dim", "q_lora_rank", "num_experts_per_tok", "o_groups", "o_lora_rank",
             "index_n_heads", "index_head_dim", "index_topk", "sliding_window", "hc_mult",
             "partial_rotary_factor", "vocab_size", "compress_rates")
VARIANTS = {
    "bf16": ["features.deepseek_v4.qat=none"],
    "qat-torch": ["features.deepseek_v4.qat=fp8_blockwise", "features.deepseek_v4.qat_kernel=torch"],
    "qat-triton": ["features.deepseek_v4.qat=fp8_blockwise",
                   "features.deepseek_v4.qat_kernel=triton"],
    "qat-fp8-gemm": ["features.deepseek_v4.qat=fp8_blockwise_gemm",
                     "features.deepseek_v4.qat_kernel=triton"],
}






def v4_shapes(layers: int, experts: int) -> dict:
    """DeepseekV4Config's defaults (V4-Flash) for the fields the tiny preset sets, fewer layers
    and routed experts."""
    from transformers import DeepseekV4Config

    defaults = DeepseekV4Config()
    shapes = {name: getattr(defaults, name) for name in V4_FIELDS}
    kinds = (STEP_LAYERS * layers)[:layers]
    shapes.update(num_hidden_layers=layers, n_routed_experts=experts, layer_types=kinds,
                  mlp_layer_types=["hash_moe"] + ["moe"] * (layers - 1),
                  max_position_embeddings=65536)
    return shapes


def hydra_value(value: object) -> str:
    """``value`` in Hydra's override grammar (unquoted dict keys and strings)."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    return str(value)


def gemm_rows(m: int, k: int, n: int, device: torch.device, reps: int) -> dict:
    """Part 1: one GEMM, every way of computing it; times in ms, errors vs the fake quant."""
    from graft_deepseek_v4.quant.kernels import torch_kernels, triton_available, triton_kernels

    generator = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(m, k, device=device, generator=generator).bfloat16()
    w = (torch.randn(n, k, device=device, generator=generator) * 0.02).bfloat16()
    eager = torch_kernels()
    run = {"bf16 matmul": lambda: x @ w.t(),
           "eager fake quant W+A + matmul": lambda: eager.fp8(x, (1, 128))
           @ eager.fp8(w, (128, 128)).t()}
    rows: dict = {"shape": [m, k, n]}
    gpu = device.type == "cuda" and triton_available()
    if gpu:
        fused = triton_kernels()
        w_fq = fused.fp8(w, (128, 128))
        run["triton fake quant W+A + matmul"] = lambda: fused.fp8(x, (1, 128)) @ fused.fp8(
            w, (128, 128)).t()
        run["triton fake quant A + matmul (QAT per forward)"] = lambda: fused.fp8(
            x, (1, 128)) @ w_fq.t()
        rows.update(fp8_gemm_rows(x, w, fused, run))
    for name, fn in run.items():
        rows[name] = round(timed(fn, warmup=3, steps=reps, device=device) * 1e3, 4)
    return rows


def fp8_gemm_rows(x: torch.Tensor, w: torch.Tensor, fused, run: dict) -> dict:
    """``F.scaled_mm`` block-scaled GEMMs added to ``run``; their error against the fake quant."""
    from graft_deepseek_v4.fp8_gemm import scaled_mm_blockwise

    x_codes, x_scales = fused.quantize_fp8(x, (1, 128))
    w_codes, w_scales = fused.quantize_fp8(w, (128, 128))
    reference = (fused.fp8(x, (1, 128)) @ fused.fp8(w, (128, 128)).t()).float()
    real = scaled_mm_blockwise(x_codes, x_scales, w_codes, w_scales).float()
    run["F.scaled_mm blockwise (operands quantised)"] = lambda: scaled_mm_blockwise(
        x_codes, x_scales, w_codes, w_scales)
    run["quantise A + F.scaled_mm (fp8_blockwise_gemm per forward)"] = lambda: scaled_mm_blockwise(
        *fused.quantize_fp8(x, (1, 128)), w_codes, w_scales)
    difference = (real - reference).abs()
    return {"fp8_gemm_vs_fake_quant_mean_rel_err": float(difference.mean()
                                                         / reference.abs().mean()),
            "fp8_gemm_vs_fake_quant_max_rel_err": float(difference.max()
                                                        / reference.abs().max())}


def step_row(name: str, shapes: dict, tokens: int, device: torch.device, args) -> dict:
    """Part 2: one variant's training step through Graft's engine."""
    from graft.config import compose
    from graft.engine.batch.micro_batch import TokenSample
    from graft.engine.distributed.env import init_distributed
    from graft.training.sft import sft_loss
    from graft.training.trainer import build_engine
    from graft_deepseek_v4.weights import live_policies, step_metrics

    overrides = ["model.preset=tiny-deepseek-v4", f"engine.device={device.type}",
                 "trainer.mode=sft", f"engine.max_tokens_per_micro_batch={tokens}",
                 "optim.lr=1e-6", "optim.max_grad_norm=0",
                 f"features.deepseek_v4.expert_dtype={args.expert_dtype}", *VARIANTS[name]]
    overrides += [f"+model.overrides.{key}={hydra_value(value)}" for key, value in shapes.items()]
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    engine = build_engine(compose(overrides), init_distributed(device_preference=device.type),
                          pad_token_id=0)
    generator = torch.Generator().manual_seed(0)
    sample = TokenSample(torch.randint(3, shapes["vocab_size"], (tokens,),
                                       generator=generator).tolist(), response_start=1)
    batches = engine.micro_batches([sample])

    def step() -> None:
        engine.forward_backward(batches, sft_loss, loss_scale_factor=1.0)
        engine.optimizer_step()

    seconds = timed(step, warmup=args.warmup, steps=args.steps, device=device)
    passes = step_metrics().get("deepseek_v4/qat_weight_passes", 0.0)
    quantizers = live_policies()

    def requantize() -> None:  # one step's weight quantisation (and the masters' return)
        for quantizer in quantizers:
            quantizer.quantize()
            quantizer.restore()

    weight_quant_s = timed(requantize, warmup=1, steps=2, device=device) if quantizers else 0.0
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
    row = {"variant": name, "step_s": round(seconds, 4), "tokens_per_s": round(tokens / seconds),
           "peak_gib": round(peak, 1), "weight_quant_passes": passes,
           "weight_quant_s": round(weight_quant_s, 4),
           "params": sum(p.numel() for p in engine.model.parameters())}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny shapes on CPU (smoke test)")
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--expert-dtype", default="fp4", choices=("fp4", "fp8"))
    parser.add_argument("--gemm", default="8192,7168,7168", help="M,K,N of the GEMM benchmark")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device = torch.device("cpu" if args.small else "cuda")
    if args.small:
        args.warmup, args.steps = 1, 2
    from graft.engine.distributed.env import init_distributed

    init_distributed(device_preference=device.type)  # one process group for every variant
    m, k, n = (256, 256, 256) if args.small else map(int, args.gemm.split(","))
    gemm = gemm_rows(m, k, n, device, reps=3 if args.small else 20)
    print(json.dumps(gemm), flush=True)
    shapes = {} if args.small else v4_shapes(args.layers, args.experts)
    tokens = 64 if args.small else args.tokens
    variants = [v for v in args.variants.split(",") if device.type == "cuda" or v in
                ("bf16", "qat-torch")]
    steps = []
    for variant in variants:
        steps.append(step_row(variant, shapes or {"vocab_size": 128}, tokens, device, args))
        gc.collect()  # the variant's engine is gone before the next one is built
    base = next((r["step_s"] for r in steps if r["variant"] == "bf16"), None)
    for row in steps:
        row["overhead_vs_bf16"] = round(row["step_s"] / base - 1, 4) if base else None
    result = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
              "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "tokens": tokens, "shapes": shapes, "expert_dtype": args.expert_dtype,
              "gemm_ms": gemm, "steps": steps}
    print(f"\nGEMM {m}x{k}x{n} (ms)")
    for key, value in gemm.items():
        if key != "shape":
            print(f"  {key:<58} {value:.4g}")
    print(f"\n{'variant':<14} {'step s':>8} {'tokens/s':>9} {'vs bf16':>8} {'weight q s':>10} "
          f"{'peak GiB':>9}")
    for row in steps:
        overhead = row["overhead_vs_bf16"]
        print(f"{row['variant']:<14} {row['step_s']:>8} {row['tokens_per_s']:>9} "
              f"{'' if overhead is None else f'{overhead:+.1%}':>8} {row['weight_quant_s']:>10} "
              f"{row['peak_gib']:>9}")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()
