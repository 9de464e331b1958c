"""GPU correctness of graft-deepseek-v4's QAT: the Triton quantisers bit-equal to the PyTorch
reference, and rollout's static decode sampling the quantised policy.

For each case (large random bf16 tensors spread over many orders of magnitude, plus edge cases:
all-zero and tiny tiles, amax exactly 448 * 2^k, negative zeros, E2M1 ties, bf16's extremes, a
row count that is not a multiple of the kernel's block), the Triton kernels' dequantised output
(compared as raw bits), scales and FP8 codes must equal the reference's exactly. Both are also
compared with an independent float64 formulation (scale = 2^ceil(log2(amax / qmax)), the
exponent read with ``torch.frexp``: CUDA's float64 ``log2`` is not exact at powers of two, and
gave the next scale up for 425 of 917,504 activation tiles on an H200), which is what runs on
CPU with ``--small`` (no Triton there).

Then QAT + ``rollout.decode=static`` against ``rollout.decode=dynamic``: a few RL steps of the
tiny DeepSeek-V4 with ``features.deepseek_v4.qat=fp8_blockwise`` each way, and the mean
``train_infer_logprob_diff`` (rollout log-probs against the trainer's). The static decode's plain
copy is quantised like the policy (``graft_inference_copy``), so its mismatch must be within 2x
of the dynamic decode's (before: 0.017-0.020 against 2e-8).

    python bench/gpu/qat_check.py --out $OUT/qat_check.json     # one H200, ~1 min
    python bench/gpu/qat_check.py --small                       # CPU: reference vs float64
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from graft_deepseek_v4.quant import reference
from graft_deepseek_v4.quant.reference import AMAX_FLOOR, E2M1_MAX, E4M3_MAX, FP4_AMAX_FLOOR


def spread(*shape: int, seed: int, device: torch.device) -> torch.Tensor:
    """Random bf16 values over ~20 orders of magnitude (row- and column-wise), some exact 0."""
    generator = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(shape, device=device, generator=generator)
    rows = torch.empty(shape[:-1], device=device).uniform_(-30, 15, generator=generator).exp()
    cols = torch.empty(shape[-1], device=device).uniform_(-5, 5, generator=generator).exp()
    x = x * rows[..., None] * cols
    x[torch.rand(shape, device=device, generator=generator) < 0.01] = 0.0
    return x.bfloat16()


def edge_cases(device: torch.device) -> torch.Tensor:
    """(256, 256) bf16: one special 128x128 tile or 1x128 row group after another."""
    x = torch.zeros(256, 256)
    x[0, :128] = 0.0  # all-zero rows (rows 0-127, cols 0-127 stay zero: an all-zero tile)
    x[128:130, :128] = torch.randn(2, 128) * 1e-7  # amax below the floor
    k = torch.arange(-10, 10, dtype=torch.float64)
    x[130, :20] = (E4M3_MAX * torch.exp2(k)).float()  # amax / 448 exactly a power of two
    x[131, :20] = (E2M1_MAX * torch.exp2(k)).float()
    x[132, :8] = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, -5.0])  # E2M1 ties
    x[133, :4] = torch.tensor([448.0, 17.0, 19.0, 21.0])  # E4M3 ties
    x[134, :4] = torch.tensor([-0.0, -1e-30, 3.3e38, -3.3e38])  # -0, tiny, bf16's extremes
    x[:, 128:] = torch.randn(256, 128) * torch.logspace(-20, 20, 256)[:, None]
    return x.bfloat16().to(device)


def ceil_log2(x: torch.Tensor) -> torch.Tensor:
    """ceil(log2(x)) of positive float64 ``x``, exactly: x = m * 2^e with m in [0.5, 1)."""
    mantissa, exponent = torch.frexp(x)
    return torch.where(mantissa == 0.5, exponent - 1, exponent).double()


def float64_fp8(x: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """An independent fake quant: float64 power-of-two ceiling scales (exact for bf16 inputs)."""
    tiles = reference._tile_view(x, block, "check").double()
    amax = tiles.abs().amax(dim=(-3, -1), keepdim=True).clamp(min=torch.tensor(AMAX_FLOOR).float()
                                                              .item())
    scale = torch.exp2(ceil_log2(amax / E4M3_MAX))
    codes = (tiles / scale).float().to(torch.float8_e4m3fn)
    out = (codes.double() * scale).reshape(x.shape).to(torch.bfloat16)
    return out, scale.float().reshape(reference._scales_shape(x, block))


def float64_fp4(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    tiles = reference._tile_view(x, (1, group), "check").double()
    amax = tiles.abs().amax(dim=-1, keepdim=True).clamp(min=FP4_AMAX_FLOOR)
    scale = torch.exp2(ceil_log2(amax / E2M1_MAX))
    values = reference.round_to_e2m1((tiles / scale).float()).double()
    out = (values * scale).reshape(x.shape).to(torch.bfloat16)
    return out, scale.float().reshape(reference._scales_shape(x, (1, group)))


def cases(device: torch.device, small: bool) -> list[tuple[str, torch.Tensor, str, object]]:
    """(name, input, kind, block or group)."""
    scale = 16 if small else 1
    edges = edge_cases(device)
    return [
        ("activations 1x128", spread(16384 // scale, 7168 // scale // 128 * 128, seed=0,
                                     device=device), "fp8", (1, 128)),
        ("rows not a multiple of the block", spread(1000, 512, seed=1, device=device), "fp8",
         (1, 128)),
        ("kv cache 1x64", spread(16384 // scale, 448, seed=2, device=device), "fp8", (1, 64)),
        ("weights 128x128", spread(7168 // scale // 128 * 128, 7168 // scale // 128 * 128,
                                   seed=3, device=device), "fp8", (128, 128)),
        ("fp8 experts 128x128", spread(8, 4096 // scale, 2048 // scale, seed=4, device=device),
         "fp8", (128, 128)),
        ("fp4 experts 1x32", spread(16, 4096 // scale, 2048 // scale, seed=5, device=device), "fp4",
         32),
        ("edge cases 128x128", edges, "fp8", (128, 128)),
        ("edge cases 1x128", edges, "fp8", (1, 128)),
        ("edge cases fp4 1x32", edges, "fp4", 32),
    ]


def first_differences(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                      count: int = 5) -> list[list[float]]:
    """``[input, a, b]`` at the first ``count`` positions where ``a`` and ``b`` differ in bits."""
    view = {torch.bfloat16: torch.int16, torch.float32: torch.int32}[a.dtype]
    where = (a.view(view) != b.view(view)).reshape(-1).nonzero().flatten()[:count]
    flat = [t.reshape(-1).float() for t in (x, a, b)]
    return [[float(t[i]) for t in flat] for i in where.tolist()]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> tuple[bool, int]:
    """Bitwise equality (so -0.0 != 0.0) and the number of differing elements."""
    view = {torch.bfloat16: torch.int16, torch.float32: torch.int32,
            torch.float8_e4m3fn: torch.uint8}[a.dtype]
    differ = int((a.view(view) != b.view(view)).sum())
    return differ == 0, differ


def check(name: str, x: torch.Tensor, kind: str, block: object, fused: object | None) -> dict:
    if kind == "fp8":
        ours = reference.fake_quant_fp8(x, block)
        independent = float64_fp8(x, block)
    else:
        ours = reference.fake_quant_fp4(x, block)
        independent = float64_fp4(x, block)
    row = {"case": name, "shape": list(x.shape), "block": block,
           "reference_vs_float64": all(same_bits(a, b)[0] for a, b in zip(ours, independent,
                                                                            strict=True))}
    if not row["reference_vs_float64"]:  # [input, reference, float64] where they differ
        row["reference_vs_float64_first"] = first_differences(x, ours[0], independent[0])
        row["scales_differing"] = same_bits(ours[1], independent[1])[1]
    if fused is not None:
        started = time.perf_counter()
        theirs = (fused.fake_quant_fp8(x, block) if kind == "fp8"
                  else fused.fake_quant_fp4(x, block))
        torch.cuda.synchronize()
        row["triton_s"] = round(time.perf_counter() - started, 4)
        (out_equal, out_differ), (scales_equal, _) = (same_bits(ours[0], theirs[0]),
                                                      same_bits(ours[1], theirs[1]))
        row.update(triton_output_equal=out_equal, triton_output_differing=out_differ,
                   triton_scales_equal=scales_equal)
        if not out_equal:  # [input, reference, triton] where they differ
            row["triton_first"] = first_differences(x, ours[0], theirs[0])
        if kind == "fp8":
            codes, scales = fused.quantize_fp8(x, block)
            ref_codes, ref_scales = reference.quantize_fp8(x, block)
            row["triton_codes_equal"] = (same_bits(codes, ref_codes)[0]
                                         and same_bits(scales, ref_scales)[0])
    row["ok"] = all(v for k, v in row.items() if k.endswith(("_equal", "_float64")))
    return row


def decode_mismatch(decode: str, run_dir: Path, *, device: str, steps: int) -> dict:
    """``steps`` RL steps of the tiny DeepSeek-V4 with QAT and ``rollout.decode=decode``: the
    per-step and mean ``train_infer_logprob_diff`` (the trainer recomputes the old log-probs
    every step) and the step time."""
    from graft.config import compose
    from graft.training.trainer import Trainer

    cfg = compose([f"trainer.run_dir={run_dir}", "model.preset=tiny-deepseek-v4",
                   f"engine.device={device}", "features.deepseek_v4.qat=fp8_blockwise",
                   f"rollout.decode={decode}", f"trainer.total_steps={steps}",
                   "rollout.prompts_per_step=8", "rollout.n=4", "rollout.max_new_tokens=32",
                   "algorithm.old_logprobs=always", "checkpoint.every_steps=0",
                   "checkpoint.save_at_end=false", "export.hf_at_end=false"])
    started = time.perf_counter()
    rows = Trainer(cfg).fit()
    diffs = [row["train_infer_logprob_diff"] for row in rows]
    return {"decode": decode, "mismatch_per_step": diffs, "mismatch": sum(diffs) / len(diffs),
            "seconds": round(time.perf_counter() - started, 1)}


def check_decode(device: torch.device, small: bool) -> dict:
    """QAT + static decode against dynamic decode: ok when static is within 2x of dynamic."""
    steps = 1 if small else 3
    with tempfile.TemporaryDirectory() as folder:
        static, dynamic = (decode_mismatch(decode, Path(folder) / decode, device=device.type,
                                           steps=steps) for decode in ("static", "dynamic"))
    ratio = static["mismatch"] / max(dynamic["mismatch"], 1e-12)
    return {"case": "qat + static decode vs dynamic", "static": static, "dynamic": dynamic,
            "ratio": ratio, "target": "static <= 2x dynamic",
            "ok": static["mismatch"] <= 2 * dynamic["mismatch"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="CPU: reference vs float64 only")
    parser.add_argument("--skip-decode", action="store_true",
                        help="only the quantisers (no QAT + static decode runs)")
    parser.add_argument("--out", default=None, help="write the results as JSON to this path")
    args = parser.parse_args()
    device = torch.device("cpu" if args.small else "cuda")
    fused = None
    if device.type == "cuda":
        from graft_deepseek_v4.quant import triton_kernels as fused
    rows = [check(*case, fused) for case in cases(device, args.small)]
    for row in rows:
        print(json.dumps(row), flush=True)
    print(f"\n{'case':<34} {'ref=f64':>8} {'triton out':>11} {'scales':>7} {'codes':>6}")
    for row in rows:
        print(f"{row['case']:<34} {row['reference_vs_float64']!s:>8} "
              f"{row.get('triton_output_equal', '-')!s:>11} {row.get('triton_scales_equal', '-')!s:>7} "
              f"{row.get('triton_codes_equal', '-')!s:>6}")
    ok = all(row["ok"] for row in rows)
    print("ALL BIT-EQUAL" if ok else "MISMATCH")
    decode = None
    if not args.skip_decode:
        decode = check_decode(device, args.small)
        print(json.dumps(decode), flush=True)
        print(f"\ntrain_infer_logprob_diff with QAT: static {decode['static']['mismatch']:.3g}, "
              f"dynamic {decode['dynamic']['mismatch']:.3g} ({decode['ratio']:.2f}x; target "
              f"<= 2x): {'OK' if decode['ok'] else 'ABOVE TARGET'}")
        ok = ok and decode["ok"]
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
                       "device": str(device), "ok": ok, "rows": rows, "decode": decode},
                      handle, indent=2)
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
