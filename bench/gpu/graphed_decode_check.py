"""GPU check of Graft's graphed decode loop (`graft.rollout.graphed_decode`): the decode step
replayed from a CUDA graph samples the same tokens with the same log-probs as the same step run
eagerly (same generator state), one graph per (batch, cache length), reused across calls.

A TinyLlama-1.1B-shaped Llama (random bf16 weights, SDPA), 64 left-padded prompts of 8-40
tokens, 64 new tokens; a small Llama with a 12-token vocabulary whose rows end early (EOS is
one token in 12), so the batch shrinks as they finish: same tokens, log-probs and batch sizes;
then the per-token time of both at 256 prompts of the large one.

    python3 bench/gpu/graphed_decode_check.py --out $OUT/graphed_decode_check.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from graft.rollout import SamplingSpec
from graft.rollout.graphed_decode import GraphedDecoder

SHAPES = {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
          "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 64,
          "vocab_size": 32000}


def prompts(count: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.randint(8, 41, (count,), generator=generator).tolist()
    width = max(lengths)
    ids = torch.zeros((count, width), dtype=torch.long)
    mask = torch.zeros((count, width), dtype=torch.long)
    for row, length in enumerate(lengths):
        ids[row, width - length:] = torch.randint(3, 32000, (length,), generator=generator)
        mask[row, width - length:] = 1
    return ids.cuda(), mask.cuda()


def run(decoder: GraphedDecoder, ids, mask, spec: SamplingSpec, seed: int):
    torch.cuda.manual_seed(seed)
    torch.cuda.synchronize()
    started = time.perf_counter()
    tokens, logprobs = decoder.generate(ids, mask, spec)
    torch.cuda.synchronize()
    return tokens, logprobs, time.perf_counter() - started


def shrinking_check() -> dict:
    """Graphed and eager decoders on rows that finish early: identical outputs and batches."""
    config = AutoConfig.for_model("llama", hidden_size=256, intermediate_size=512,
                                  num_hidden_layers=2, num_attention_heads=8,
                                  num_key_value_heads=2, vocab_size=12, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).cuda().eval()
    ids = torch.randint(4, 12, (64, 6), generator=torch.Generator().manual_seed(1)).cuda()
    mask = torch.ones_like(ids)
    outputs = {}
    for name, graphs in (("graphed", True), ("eager", False)):
        decoder = GraphedDecoder(model, pad_token_id=0, eos_token_id=3, use_graphs=graphs,
                                 check_every=4)
        tokens, logprobs, _ = run(decoder, ids, mask, SamplingSpec(1.0, 1.0, 96), seed=3)
        outputs[name] = (tokens, logprobs, decoder.batch_sizes)
    (g_tokens, g_logprobs, g_sizes), (e_tokens, e_logprobs, e_sizes) = outputs.values()
    return {"same_tokens": bool(torch.equal(g_tokens, e_tokens)),
            "same_logprobs": bool(torch.equal(g_logprobs, e_logprobs)),
            "batch_sizes": g_sizes, "same_batch_sizes": g_sizes == e_sizes,
            "steps": g_tokens.shape[1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    config = AutoConfig.for_model("llama", **SHAPES, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).cuda().eval()
    graphed = GraphedDecoder(model, pad_token_id=0, eos_token_id=2, use_graphs=True)
    eager = GraphedDecoder(model, pad_token_id=0, eos_token_id=2, use_graphs=False)
    generator = torch.Generator().manual_seed(0)
    ids, mask = prompts(64, generator)
    spec = SamplingSpec(1.0, 1.0, 64)
    g_tokens, g_logprobs, _ = run(graphed, ids, mask, spec, seed=1)
    e_tokens, e_logprobs, _ = run(eager, ids, mask, spec, seed=1)
    again, _, _ = run(graphed, ids, mask, spec, seed=1)
    result = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
              "device": torch.cuda.get_device_name(),
              "same_tokens": bool(torch.equal(g_tokens, e_tokens)),
              "same_logprobs": bool(torch.equal(g_logprobs, e_logprobs)),
              "max_logprob_diff": float((g_logprobs - e_logprobs).abs().max()),
              "repeat_same_tokens": bool(torch.equal(again, g_tokens)),
              "graphs_captured": sum(s.graph is not None for s in graphed._states.values())}
    result["shrinking"] = shrinking_check()
    ids, mask = prompts(256, generator)
    spec = SamplingSpec(1.0, 1.0, 256)
    timings = {}
    for name, decoder in (("graphed", graphed), ("eager", eager)):
        run(decoder, ids, mask, spec, seed=2)  # warm-up (capture)
        tokens, _, seconds = run(decoder, ids, mask, spec, seed=2)
        timings[name] = {"seconds": round(seconds, 3), "steps": tokens.shape[1],
                         "ms_per_step": round(1000 * seconds / tokens.shape[1], 3),
                         "rows_x_steps_per_s": round(tokens.numel() / seconds)}
    result["batch_256"] = timings
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()
