"""GPU check of ``features.exact.enabled`` (#27) at small shapes, for one short device call.

1. ``gradients``: the Triton window attention (`graft_exact.triton_attention`) inside
   the exact kernels' mode, against SDPA: the output's largest difference and the gradients'
   relative errors (q, k, v), bf16 and fp32, a packed row of three samples; ``sinks``: the
   same with attention sinks over a sliding window, against transformers' GPT-OSS attention.
2. ``model_gradients``: a small Llama with the exact kernels installed against the same weights
   with SDPA, one forward + backward of a packed batch: every parameter has a gradient, and each
   gradient's relative error.
3. ``experts``: the grouped Triton experts (`graft_exact.triton_experts`, bf16) of a
   Qwen3-MoE layer (128 experts, top-8, hidden 2048) against transformers' eager loop: the
   largest difference, and whether the first token's output is bit-equal alone, in a batch of
   256 (a decode step) and of 4096 (a training micro-batch).
4. ``logprob_dtype``: the core's Triton log-prob kernel on bf16 logits and on their fp32
   copies (what transformers' ``generate`` hands back): the fraction of rows with the same
   bits, and the largest difference (the embedded engine scores ``generate``'s logits cast back
   to the compute dtype since 2026-12-08; this part says whether that was needed).
5. ``rl``: ``graft train features.exact.enabled=true`` on the tiny dense and MoE presets
   (``--presets``) on the GPU (the static decode loop from CUDA graphs where it serves the model):
   each step's ``train_infer_logprob_diff`` and exact fraction (0.0 and 1.0 on every step), and
   the step times.

    python3 bench/gpu/exact_check.py --out $OUT/exact_check.json
    python3 bench/gpu/exact_check.py --device cpu --steps 2   # smoke test (parts 2 and 4)
    python3 bench/gpu/exact_check.py --parts rl --presets tiny-gpt-oss \
        --rl-overrides +model.overrides.sliding_window=8   # sinks, a window shorter than the run's

The result file is written after every part (a device call's time limit keeps what is done).
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
from pathlib import Path
from typing import Any

import torch
from graft_exact import exact_kernels, install_exact_kernels

import graft

RL_KEYS = ("train_infer_logprob_diff", "train_infer_logprob_exact_fraction", "loss",
           "grad_norm", "reward_mean", "response_length", "rollout_s", "update_s", "step_time_s")


def relative(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got.float() - expected.float()).norm() / expected.float().norm().clamp_min(1e-30))


def attention_gradients(device: str, dtype: torch.dtype) -> dict[str, Any]:
    """The Triton attention against SDPA on one packed row (3 samples, GQA 8/2, head dim 64)."""
    from graft_exact.attention_grad import invariant_attention

    torch.manual_seed(0)
    segment = torch.tensor([0] * 100 + [1] * 300 + [2] * 112, device=device)
    slots = torch.arange(len(segment), device=device)
    mask = ((segment[:, None] == segment[None, :]) & (slots[None, :] <= slots[:, None]))[None, None]
    q = torch.randn(1, 8, 512, 64, device=device, dtype=dtype, requires_grad=True)
    k = torch.randn(1, 2, 512, 64, device=device, dtype=dtype, requires_grad=True)
    v = torch.randn(1, 2, 512, 64, device=device, dtype=dtype, requires_grad=True)
    weights = torch.randn(1, 512, 8, 64, device=device, dtype=dtype)
    with exact_kernels():
        out = invariant_attention(q, k, v, mask, scale=0.125)
        (out.float() * weights).sum().backward()
    ours = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    reference = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), attn_mask=mask,
        scale=0.125).transpose(1, 2)
    (reference.float() * weights).sum().backward()
    return {"dtype": str(dtype), "output_max_abs_diff": float((out - reference).abs().max()),
            **{f"grad_{n}_relative": relative(g, t.grad) for n, g, t
               in zip("qkv", ours, (q, k, v), strict=True)}}


def attention_sinks(device: str, dtype: torch.dtype) -> dict[str, Any]:
    """The Triton attention with attention sinks (GPT-OSS's) against transformers' GPT-OSS
    eager attention on a 128-key sliding window of one 512-token sample (GQA 8/2, head dim
    64): output and gradients (q, k, v, sinks); and whether the last query's output is
    bit-equal as a decode step over a cache where the sample starts elsewhere."""
    from graft_exact.attention_grad import invariant_attention
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    torch.manual_seed(0)
    slots = torch.arange(512, device=device)
    window = (slots[None, :] <= slots[:, None]) & (slots[None, :] > slots[:, None] - 128)
    q = torch.randn(1, 8, 512, 64, device=device, dtype=dtype, requires_grad=True)
    k = torch.randn(1, 2, 512, 64, device=device, dtype=dtype, requires_grad=True)
    v = torch.randn(1, 2, 512, 64, device=device, dtype=dtype, requires_grad=True)
    module = torch.nn.Module()
    module.sinks = torch.nn.Parameter(torch.randn(8, device=device, dtype=dtype))
    module.num_key_value_groups, module.training = 4, False
    weights = torch.randn(1, 512, 8, 64, device=device, dtype=dtype)
    inputs = (q, k, v, module.sinks)
    with exact_kernels():
        out = invariant_attention(q, k, v, window[None, None], scale=0.125, sinks=module.sinks)
        (out.float() * weights).sum().backward()
        cache_k = torch.randn(1, 2, 700, 64, device=device, dtype=dtype)
        cache_v = torch.randn(1, 2, 700, 64, device=device, dtype=dtype)
        cache_k[:, :, 100:612], cache_v[:, :, 100:612] = k.detach(), v.detach()
        attend = (torch.arange(700, device=device) > 611 - 128) & \
            (torch.arange(700, device=device) <= 611)
        step = invariant_attention(q[:, :, -1:].detach(), cache_k, cache_v,
                                   attend[None, None, None], scale=0.125, sinks=module.sinks)
    ours = [t.grad.clone() for t in inputs]
    for t in inputs:
        t.grad = None
    additive = torch.zeros(512, 512, device=device, dtype=dtype).masked_fill(~window, float("-inf"))
    reference = eager_attention_forward(module, q, k, v, additive[None, None], scaling=0.125)[0]
    (reference.float() * weights).sum().backward()
    return {"dtype": str(dtype),
            "output_max_abs_diff": float((out - reference).detach().abs().max()),
            "decode_step_bit_equal": torch.equal(step[0, 0], out[0, -1]),
            **{f"grad_{n}_relative": relative(g, t.grad) for n, g, t
               in zip(("q", "k", "v", "sinks"), ours, inputs, strict=True)}}


def model_gradients(device: str) -> dict[str, Any]:
    """A 2-layer Llama (hidden 256) in fp32: exact kernels against SDPA, same weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("llama", vocab_size=512, hidden_size=256, intermediate_size=512,
                                  num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=64, attn_implementation="sdpa")
    torch.manual_seed(0)
    plain = AutoModelForCausalLM.from_config(config).to(device)
    exact = copy.deepcopy(plain)
    install_exact_kernels(exact)
    ids = torch.randint(0, 512, (2, 96), device=device)
    plain(input_ids=ids, labels=ids).loss.backward()
    with exact_kernels():
        exact(input_ids=ids, labels=ids).loss.backward()
    missing = [n for n, p in exact.named_parameters() if p.grad is None]
    errors = {n: relative(p.grad, dict(plain.named_parameters())[n].grad)
              for n, p in exact.named_parameters() if p.grad is not None}
    return {"parameters": len(errors) + len(missing), "without_gradient": missing,
            "largest_relative_error": max(errors.values()),
            "q_proj_relative_error": errors["model.layers.0.self_attn.q_proj.weight"]}


def experts_invariance(device: str, *, hidden_size: int = 2048, intermediate: int = 768,
                       num_experts: int = 128, top_k: int = 8, batches: tuple[int, ...] = (1, 256, 4096),
                       dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
    """One MoE layer of Qwen3-30B-A3B's expert shapes (by default): Triton experts against
    eager, and each token's output bit-equal in every batch of ``batches`` tokens."""
    from graft_exact.triton_experts import triton_experts_forward
    from transformers import AutoConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    config = AutoConfig.for_model("qwen3_moe", hidden_size=hidden_size,
                                  moe_intermediate_size=intermediate, num_experts=num_experts,
                                  num_experts_per_tok=top_k)
    torch.manual_seed(0)
    experts = Qwen3MoeExperts(config).to(device, dtype)
    for weight in (experts.gate_up_proj, experts.down_proj):
        torch.nn.init.normal_(weight, std=0.02)
    tokens = max(batches)
    hidden = torch.randn(tokens, hidden_size, device=device, dtype=dtype)
    weights, chosen = torch.randn(tokens, num_experts, device=device).softmax(-1).topk(top_k, -1)
    weights = weights.to(dtype)
    with torch.no_grad(), exact_kernels():
        outs = {n: triton_experts_forward(experts, hidden[:n], chosen[:n], weights[:n])
                for n in batches}
        eager = type(experts).forward.__wrapped__(experts, hidden, chosen, weights)
    smallest = min(batches)
    return {"max_abs_diff_vs_eager": float((outs[tokens] - eager).abs().max()),
            "rows_equal_in_every_batch": all(torch.equal(outs[smallest], out[:smallest])
                                             for out in outs.values()),
            "batches": list(batches)}


def logprob_dtype(device: str) -> dict[str, Any]:
    """The log-prob kernel's bits for bf16 logits against their fp32 copies (64 rows)."""
    from graft.engine.head.logprobs import token_logprobs

    out = {}
    for vocab in (512, 32000, 201088):  # tiny presets', TinyLlama's, GPT-OSS's vocabularies
        torch.manual_seed(0)
        logits = (3 * torch.randn(64, vocab, device=device)).bfloat16()
        labels = torch.randint(0, vocab, (64,), device=device)
        temperature = torch.ones(64, device=device)
        bf16 = token_logprobs(logits, labels, temperature)
        fp32 = token_logprobs(logits.float(), labels, temperature)
        out[vocab] = {"same_bits_fraction": (bf16 == fp32).float().mean().item(),
                      "max_difference": (bf16 - fp32).abs().max().item()}
    return out


def rl_run(folder: Path, device: str, steps: int, preset: str,
           extra: list[str]) -> dict[str, Any]:
    rows = graft.train(overrides=[
        f"trainer.run_dir={folder}", f"engine.device={device}", f"model.preset={preset}",
        "features.exact.enabled=true", "rollout.decode=static", "rollout.prompts_per_step=8", "rollout.n=4",
        "rollout.max_new_tokens=24", f"trainer.total_steps={steps}", "checkpoint.every_steps=0",
        "checkpoint.save_at_end=false", "export.hf_at_end=false",
        "trainer.print_sample_every_steps=0", *extra])
    return {"overrides": extra, "steps": [{k: r.get(k) for k in RL_KEYS} for r in rows],
            "exact_every_step": all(r["train_infer_logprob_diff"] == 0.0
                                    and r["train_infer_logprob_exact_fraction"] == 1.0
                                    for r in rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="exact_check.json")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=4)
    parts = ["gradients", "sinks", "model_gradients", "experts", "logprob_dtype", "rl"]
    parser.add_argument("--parts", nargs="+", default=parts, choices=parts)
    parser.add_argument("--presets", nargs="+", default=["tiny-llama", "tiny-qwen3-moe"],
                        help="the rl part's presets")
    parser.add_argument("--rl-overrides", nargs="*", default=[],
                        help="settings the rl part's runs add (+model.overrides.sliding_window=8)")
    args = parser.parse_args()
    report: dict[str, Any] = {}

    def save(part: str, value: Any) -> None:
        report[part] = value
        Path(args.out).write_text(json.dumps(report, indent=2))
        print(part, json.dumps(value), flush=True)

    if args.device == "cuda" and "gradients" in args.parts:
        save("gradients", [attention_gradients("cuda", d) for d in (torch.bfloat16, torch.float32)])
    if args.device == "cuda" and "sinks" in args.parts:
        save("sinks", [attention_sinks("cuda", d) for d in (torch.bfloat16, torch.float32)])
    if "model_gradients" in args.parts:
        save("model_gradients", model_gradients(args.device))
    if args.device == "cuda" and "experts" in args.parts:
        save("experts", experts_invariance("cuda"))
    if "logprob_dtype" in args.parts:
        save("logprob_dtype", logprob_dtype(args.device))
    with tempfile.TemporaryDirectory() as root:
        for preset in args.presets if "rl" in args.parts else ():
            save(f"rl_{preset}", rl_run(Path(root) / preset, args.device, args.steps, preset,
                                        args.rl_overrides))


if __name__ == "__main__":
    main()
