"""SFT step throughput on one GPU: Graft's engine against a plain FSDP2 loop, same shapes, one run.

Model: Llama-3-8B layer shapes (hidden 4096, MLP 14336, 32 heads / 8 KV, vocab 128256) with 16
layers so AdamW fits, random weights; one 8192-token sequence per step; FSDP2 on one GPU with bf16
compute and fp32 master weights and reduction. Each variant runs ``--warmup`` steps, then times
``--steps`` steps (forward, backward, AdamW).

Model FLOPs per step: 6 N S + 6 L h S^2 (N parameters, S tokens, L layers, h hidden).

Peer ("plain"): transformers model + ``fully_shard`` per block and root + fused AdamW, loss from
``model(input_ids, labels=...)`` (HF's own cross-entropy). No Graft code.

    python bench/sft_throughput.py --out $OUT/sft_throughput.json          # on the GPU
    python bench/sft_throughput.py --tiny                                  # CPU smoke test
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections.abc import Callable
from functools import partial

import torch
from timing import timed

SHAPES_8B = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
             "head_dim": 128,
             "num_key_value_heads": 8, "vocab_size": 128256, "num_hidden_layers": 16,
             "max_position_embeddings": 8192}
SHAPES_TINY = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "head_dim": 16,
               "num_key_value_heads": 2, "vocab_size": 128, "num_hidden_layers": 2,
               "max_position_embeddings": 512}


def model_flops(num_params: int, shapes: dict, tokens: int) -> float:
    return 6 * num_params * tokens + 6 * shapes["num_hidden_layers"] * shapes["hidden_size"] * tokens**2






def plain_loop(shapes: dict, tokens: int, checkpointing: bool, device: torch.device):
    """The peer: HF model, fully_shard, fused AdamW, HF loss."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("llama", **shapes, tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.config.use_cache = False
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    bf16 = device.type == "cuda"
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else None,
                                  reduce_dtype=torch.float32 if bf16 else None)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")
    ids = torch.randint(3, shapes["vocab_size"], (1, tokens), device=device)

    def step() -> None:
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return model, step


def graft_engine(shapes: dict, tokens: int, checkpointing: bool, compile_blocks: bool,
                 device: torch.device):
    """Graft's own engine, exactly as `graft train` builds it."""
    from graft.config import compose
    from graft.engine.batch.micro_batch import TokenSample
    from graft.engine.distributed.env import init_distributed
    from graft.training.sft import sft_loss
    from graft.training.trainer import build_engine

    overrides = ["model.preset=tiny-llama", f"engine.device={device.type}", "trainer.mode=sft",
                 f"engine.activation_checkpointing={str(checkpointing).lower()}",
                 f"engine.compile={str(compile_blocks).lower()}",
                 f"engine.max_tokens_per_micro_batch={tokens}", "optim.lr=1e-5",
                 "optim.max_grad_norm=0", "+model.overrides.tie_word_embeddings=false"]
    overrides += [f"+model.overrides.{key}={value}" for key, value in shapes.items()]
    cfg = compose(overrides)
    engine = build_engine(cfg, init_distributed(device_preference=device.type), pad_token_id=0)
    generator = torch.Generator().manual_seed(0)
    sample = TokenSample(torch.randint(3, shapes["vocab_size"], (tokens,),
                                       generator=generator).tolist(), response_start=1)
    batches = engine.micro_batches([sample])

    def step() -> None:
        engine.forward_backward(batches, sft_loss, loss_scale_factor=1.0)
        engine.optimizer_step()

    return engine.model, step


def check_fused_logprobs(device: torch.device) -> dict:
    """The fused (compiled) log-prob kernels against a float64 reference, fresh random inputs."""
    from graft.engine.head.logprobs import token_logprobs

    logits = torch.randn(2048, 128256, device=device, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, 128256, (2048,), device=device)
    temperature = torch.rand(2048, device=device) + 0.5
    grad = torch.randn(2048, device=device)
    out = token_logprobs(logits, labels, temperature)
    (got,) = torch.autograd.grad(out, logits, grad)
    ref_logits = logits.detach().double().requires_grad_()
    ref = torch.log_softmax(ref_logits / temperature.double()[:, None], -1).gather(
        1, labels[:, None]).squeeze(1)
    (ref_grad,) = torch.autograd.grad(ref, ref_logits, grad.double())
    return {"logprob_rel_err": float((out.double() - ref).norm() / ref.norm()),
            "grad_rel_err": float((got.double() - ref_grad).norm() / ref_grad.norm())}


def measure(name: str, build: Callable, shapes: dict, tokens: int, args, device) -> dict:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    model, step = build()
    params = sum(p.numel() for p in model.parameters())
    seconds = timed(step, warmup=args.warmup, steps=args.steps, device=device)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
    row = {"variant": name, "step_s": round(seconds, 4), "tokens_per_s": round(tokens / seconds),
           "model_tflops": round(model_flops(params, shapes, tokens) / seconds / 1e12, 1),
           "peak_gib": round(peak, 1), "params": params}
    print(json.dumps(row), flush=True)
    del model, step
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny shapes on CPU (smoke test)")
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--variants", default="plain,graft,graft-compile")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device = torch.device("cpu" if args.tiny else "cuda")
    shapes = SHAPES_TINY if args.tiny else SHAPES_8B
    tokens = 256 if args.tiny else args.tokens
    from graft.engine.distributed.env import init_distributed

    init_distributed(device_preference=device.type)  # one process group for every variant
    checks = check_fused_logprobs(device) if device.type == "cuda" else {}
    print(json.dumps(checks), flush=True)
    rows = []
    for checkpointing in (False, True):
        for variant in args.variants.split(","):
            name = f"{variant}{' +AC' if checkpointing else ''}"
            if variant == "plain":
                build = partial(plain_loop, shapes, tokens, checkpointing, device)
            else:
                build = partial(graft_engine, shapes, tokens, checkpointing,
                                variant == "graft-compile", device)
            rows.append(measure(name, build, shapes, tokens, args, device))
    result = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name() if
              device.type == "cuda" else "cpu", "torch": torch.__version__, "tokens": tokens,
              "shapes": shapes, "fused_logprob_check": checks, "rows": rows}
    print(f"{'variant':<20} {'tokens/s':>9} {'TFLOP/s':>8} {'step s':>7} {'peak GiB':>9}")
    for r in rows:
        print(f"{r['variant']:<20} {r['tokens_per_s']:>9} {r['model_tflops']:>8} "
              f"{r['step_s']:>7} {r['peak_gib']:>9}")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()
