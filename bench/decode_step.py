"""One decode step of the rollout (#40): its latency at batch 1, 8, 64 and 256 and the kernels it
launches, today's default decode against graft-exact's.

The model is a TinyLlama-1.1B-shaped Llama (random bf16 weights, SDPA; hidden 2048, 22 layers,
vocabulary 32000), decoded by graft-graphed-decode's loop as an RL rollout decodes it on CUDA:

- ``default``: the loop with each block's step fused by inductor (``fuse_kernels``, what
  ``auto`` picks without graft-exact);
- ``exact``: the exact kernels installed (``install_exact_kernels``) and the loop's steps inside
  their dispatch mode (``features.exact.enabled=true``), unfused.

For each batch size, prompts of 32 tokens (no row ends: no EOS) decode 224 and then 96 new tokens
(``--tokens``) over the same 256-slot cache, each after a warm-up call (captures, compilation):

- ``ms_per_step``: the loop's time per token, ``(t(224) - t(96)) / 128`` (graph replays,
  sampling, the host's checks; steps attending to 128-256 keys), from ``loop_s``, the two
  calls' seconds;
- ``replay_ms``: one replay of the step's CUDA graph attending to the whole cache;
- ``kernels``: the kernels one step launches, run outside its graph (torch.profiler), and their
  total microseconds; ``exact_mode``: whether that step ran inside graft-exact's mode.

    python3 bench/decode_step.py --out $OUT/results/decode_step.json
    python3 bench/decode_step.py --tiny --batches 1 8 --tokens 8 24 --out /tmp/ds.json  # CPU smoke
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from timing import replay_ms

PROMPT = 32
TOKENS = (96, 224)  # new tokens of the short and the long call (--tokens)
SHAPES = {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
          "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 64,
          "vocab_size": 32000}
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512}
HEADLINE = ("batch 256: default {variants.default.256.ms_per_step} ms a step "
            "({variants.default.256.kernels} kernels), exact {variants.exact.256.ms_per_step} ms "
            "({variants.exact.256.kernels} kernels); batch 1: default "
            "{variants.default.1.ms_per_step} ms, exact {variants.exact.1.ms_per_step} ms")


def llama(shapes: dict[str, int], device: torch.device) -> torch.nn.Module:
    """The decoded model: random bf16 weights (seed 0), SDPA."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("llama", **shapes, attn_implementation="sdpa")
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).to(device).eval()


def decoder(variant: str, shapes: dict[str, int], device: torch.device) -> Any:
    """The graphed decode loop of ``variant`` on a fresh model."""
    from graft.config import compose
    from graft_graphed_decode.decoder import GraphedDecoder

    model = llama(shapes, device)
    cfg = None
    if variant == "exact":
        from graft_exact import install_exact_kernels

        install_exact_kernels(model)
        cfg = compose(["features.exact.enabled=true"])
    return GraphedDecoder(model, pad_token_id=0, eos_token_id=None, use_graphs=True,
                          fuse_kernels=variant == "default" and device.type == "cuda", cfg=cfg)


def loop_seconds(loop: Any, batch: int, new_tokens: int, vocab: int,
                 device: torch.device) -> float:
    """Seconds of one ``generate`` of ``new_tokens`` for ``batch`` prompts of `PROMPT` tokens."""
    from graft.rollout import SamplingSpec

    torch.manual_seed(1)
    ids = torch.randint(3, vocab, (batch, PROMPT), device=device)
    mask = torch.ones_like(ids)
    spec = SamplingSpec(1.0, 1.0, new_tokens)
    synchronize(device)
    started = time.perf_counter()
    loop.generate(ids, mask, spec)
    synchronize(device)
    return time.perf_counter() - started


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def step_kernels(loop: Any, state: Any, attended: int, device: torch.device) -> dict[str, Any]:
    """The kernels of one step run outside its graph: their count and GPU microseconds (CPU:
    the aten operators it calls, no time)."""
    from graft_exact import exact_active
    from torch.profiler import ProfilerActivity, profile

    activity = ProfilerActivity.CUDA if device.type == "cuda" else ProfilerActivity.CPU
    modes: list[bool] = []  # whether the model ran inside graft-exact's mode
    hook = loop.model.register_forward_pre_hook(lambda *_: modes.append(exact_active()))
    loop._reset(state)
    loop._step(state, attended)  # warm
    loop._reset(state)
    synchronize(device)
    with profile(activities=[activity]) as prof:
        loop._step(state, attended)
        synchronize(device)
    loop._reset(state)
    hook.remove()
    if device.type == "cuda":
        kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
        found = {"kernels": len(kernels),
                 "kernel_us": round(sum(e.device_time for e in kernels), 1)}
    else:
        found = {"kernels": sum(1 for e in prof.events() if e.name.startswith("aten::")),
                 "kernel_us": None}
    return {**found, "exact_mode": all(modes)}


def state_replay_ms(state: Any, replays: int = 50) -> float | None:
    """Milliseconds per replay of the state's graph over its whole cache (None: no graphs)."""
    if not state.graphs:
        return None
    return round(replay_ms(state.graphs[max(state.graphs)], replays=replays, warmup=5), 4)


def measure(variant: str, batches: list[int], shapes: dict[str, int], device: torch.device,
            tokens: tuple[int, int] = TOKENS) -> dict[str, Any]:
    """Each batch size's step time, replay time and kernels for ``variant``: the step time from
    a short and a long call of ``tokens`` new tokens (the long one first: the short one reuses
    its cache)."""
    loop = decoder(variant, shapes, device)
    short, long = tokens
    rows = {}
    for batch in batches:
        seconds = {}
        for count in (long, short):
            loop_seconds(loop, batch, count, shapes["vocab_size"], device)  # warm-up
            seconds[count] = loop_seconds(loop, batch, count, shapes["vocab_size"], device)
        length = max(length for size, length in loop._states if size == batch)
        state = loop._states[(batch, length)]
        rows[batch] = {"ms_per_step": round(1000 * (seconds[long] - seconds[short])
                                            / (long - short), 4),
                       "loop_s": {str(count): round(s, 4) for count, s in seconds.items()},
                       "replay_ms": state_replay_ms(state) if device.type == "cuda" else None,
                       **step_kernels(loop, state, length, device)}
        print(variant, batch, json.dumps(rows[batch]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8, 64, 256])
    parser.add_argument("--variants", nargs="+", choices=["default", "exact"],
                        default=["default", "exact"])
    parser.add_argument("--tokens", nargs=2, type=int, default=list(TOKENS),
                        metavar=("SHORT", "LONG"),
                        help="new tokens of the two calls a step's time is the difference of")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes on CPU (smoke test)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if not 0 < args.tokens[0] < args.tokens[1]:
        parser.error(f"--tokens {args.tokens[0]} {args.tokens[1]}: 0 < SHORT < LONG")
    device = torch.device("cpu" if args.tiny else "cuda")
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "measures": "one decode step of a TinyLlama-1.1B-shaped Llama in graft-graphed-decode's "
                    "loop, default (fused blocks) against graft-exact, at each batch size",
        "command": " ".join(["bench/decode_step.py", *sys.argv[1:]]), "headline": HEADLINE,
        "variants": {}}
    for variant in args.variants:
        result["variants"][variant] = measure(variant, args.batches,
                                              TINY if args.tiny else SHAPES, device,
                                              tuple(args.tokens))
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
