"""GPU check of Graft's graphed decode loop (graft-graphed-decode's
`graft_graphed_decode.decoder`): the decode step replayed from a CUDA graph samples the same
tokens with the same log-probs as the same step run eagerly (same generator state), one graph per
(batch, cache length, attended length), reused across calls.

A TinyLlama-1.1B-shaped Llama (random bf16 weights, SDPA), 64 left-padded prompts of 8-40
tokens, 64 new tokens; a small Llama with a 12-token vocabulary whose rows end early (EOS is
one token in 12), so the batch shrinks as they finish: same tokens, log-probs and batch sizes;
then the per-token time of both at 256 prompts of the large one.

The same with the step fused by inductor (``fuse_kernels``, emulate_precision_casts): how many of
its tokens and log-probs equal the eager step's, how far both are from a full forward of the
same sequences without a cache (what the trainer computes), its compile time, kernels per step,
and one replay's time at each batch size the loop shrinks to.

First, the loop's sampler draws what torch.multinomial draws from the same generator state.

    python3 bench/gpu/graphed_decode_check.py --out $OUT/graphed_decode_check.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from graft.rollout import SamplingSpec
from graft_graphed_decode.decoder import GraphedDecoder

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
    for name, graphs, fuse in (("graphed", True, False), ("fused", True, True),
                               ("eager", False, False)):
        decoder = GraphedDecoder(model, pad_token_id=0, eos_token_id=3, use_graphs=graphs,
                                 fuse_kernels=fuse, check_every=4)
        tokens, logprobs, _ = run(decoder, ids, mask, SamplingSpec(1.0, 1.0, 96), seed=3)
        outputs[name] = (tokens, logprobs, decoder.batch_sizes)
    (g_tokens, g_logprobs, g_sizes), fused, (e_tokens, e_logprobs, e_sizes) = outputs.values()
    return {"same_tokens": bool(torch.equal(g_tokens, e_tokens)),
            "same_logprobs": bool(torch.equal(g_logprobs, e_logprobs)),
            "batch_sizes": g_sizes, "same_batch_sizes": g_sizes == e_sizes,
            "steps": g_tokens.shape[1],
            "fused_against_eager": agreement(fused[0], fused[1], e_tokens, e_logprobs),
            "fused_batch_sizes": fused[2]}


def sampler_check(decoder: GraphedDecoder) -> dict:
    """The loop's sampler against torch.multinomial on the GPU, from the same generator state."""
    logits = torch.randn(256, 32000, device="cuda").bfloat16()
    finished = torch.zeros(256, dtype=torch.bool, device="cuda")
    torch.cuda.manual_seed(11)
    token, _ = decoder._sample(logits, SamplingSpec(0.7, 1.0, 8), finished)
    torch.cuda.manual_seed(11)
    expected = torch.multinomial(torch.softmax(logits.float() / 0.7, dim=-1), 1).squeeze(1)
    return {"same_tokens_as_torch_multinomial": bool(torch.equal(token, expected))}


def full_forward_logprobs(model, ids, mask, tokens) -> torch.Tensor:
    """Log-probs of ``tokens`` from one forward per row of its prompt (padding dropped) and its
    tokens, without a cache: what the trainer computes for a sample. (A left-padded batch
    forward with position ids is not that: in a CPU run it was far from it.)"""
    rows = []
    with torch.no_grad():
        for row_ids, row_mask, row_tokens in zip(ids, mask, tokens, strict=True):
            sequence = torch.cat([row_ids[row_mask.bool()], row_tokens])[None]
            logits = model(input_ids=sequence).logits[0, -len(row_tokens) - 1:-1].float()
            rows.append(logits.log_softmax(-1).gather(-1, row_tokens[:, None]).squeeze(-1))
    return torch.stack(rows)


def agreement(tokens, logprobs, other_tokens, other_logprobs) -> dict:
    """Where two runs sampled the same tokens so far: how many log-probs are equal, how far."""
    same_so_far = (tokens == other_tokens).long().cumprod(dim=1).bool()
    diff = (logprobs - other_logprobs).abs()[same_so_far]
    agreed = diff.numel() > 0  # no row's first token agreeing leaves nothing to compare
    return {"same_tokens": bool(torch.equal(tokens, other_tokens)),
            "tokens_before_first_difference": int(same_so_far.sum()),
            "equal_logprob_fraction": float((diff == 0).float().mean()) if agreed else None,
            "max_logprob_diff": float(diff.max()) if agreed else None}


def step_kernels(decoder: GraphedDecoder, state, top: int = 20) -> dict:
    """The CUDA kernels one decode step launches, run outside its graph (torch.profiler): their
    count, total microseconds and the ``top`` kernels by total time."""
    from torch.profiler import ProfilerActivity, profile

    attended = max(state.graphs)
    decoder._reset(state)
    decoder._step(state, attended)  # warm
    decoder._reset(state)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        decoder._step(state, attended)
        torch.cuda.synchronize()
    decoder._reset(state)
    by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if event.device_type.name == "CUDA":
            by_name[event.name][0] += 1
            by_name[event.name][1] += event.device_time
    ordered = sorted(by_name.items(), key=lambda item: -item[1][1])
    return {"kernels": sum(count for count, _ in by_name.values()),
            "kernel_us": round(sum(us for _, us in by_name.values()), 1),
            "top": [{"name": name[:90], "count": count, "us": round(us, 1)}
                    for name, (count, us) in ordered[:top]]}


def replay_ms(decoder: GraphedDecoder, repeats: int = 100, warmup: int = 10) -> dict[str, float]:
    """Milliseconds per graph replay for each batch size the decoder holds graphs for, at its
    shortest and longest attended length (``"batch/attended"``). Each state starts from a reset
    cache and replays fewer steps than its cache holds (a replay past its end would write out
    of bounds), and is reset again after."""
    times = {}
    for (batch, length), state in sorted(decoder._states.items()):
        if not state.graphs:  # no CUDA: the step ran eagerly
            continue
        steps = min(repeats, length - warmup)
        for attended in sorted({min(state.graphs), max(state.graphs)}):
            graph = state.graphs[attended]
            decoder._reset(state)
            for _ in range(warmup):
                graph.replay()
            torch.cuda.synchronize()
            started = time.perf_counter()
            for _ in range(steps):
                graph.replay()
            torch.cuda.synchronize()
            times[f"{batch}/{attended}"] = round(1000 * (time.perf_counter() - started) / steps,
                                                 3)
            decoder._reset(state)
    return times


def tinyllama() -> torch.nn.Module:
    """The TinyLlama-1.1B-shaped Llama these checks decode with: random bf16 weights, SDPA."""
    config = AutoConfig.for_model("llama", **SHAPES, attn_implementation="sdpa")
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).cuda().eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    model = tinyllama()
    graphed = GraphedDecoder(model, pad_token_id=0, eos_token_id=2, use_graphs=True)
    fused = GraphedDecoder(model, pad_token_id=0, eos_token_id=2, use_graphs=True,
                           fuse_kernels=True)
    eager = GraphedDecoder(model, pad_token_id=0, eos_token_id=2, use_graphs=False)
    sampler = sampler_check(eager)
    write(args.out, {"sampler": sampler})
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
              "graphs_captured": sum(len(s.graphs) for s in graphed._states.values()),
              "sampler": sampler}
    f_tokens, f_logprobs, first_call_s = run(fused, ids, mask, spec, seed=1)
    _, _, second_call_s = run(fused, ids, mask, spec, seed=1)
    result["fused"] = {
        "first_call_s (compile, captures)": round(first_call_s, 1),
        "second_call_s": round(second_call_s, 3),
        "against_eager": agreement(f_tokens, f_logprobs, e_tokens, e_logprobs),
        "full_forward_mean_abs_diff": {
            "eager_step": float((full_forward_logprobs(model, ids, mask, e_tokens)
                                 - e_logprobs).abs().mean()),
            "fused_step": float((full_forward_logprobs(model, ids, mask, f_tokens)
                                 - f_logprobs).abs().mean())}}
    write(args.out, result)
    result["shrinking"] = shrinking_check()
    write(args.out, result)
    ids, mask = prompts(256, generator)
    spec = SamplingSpec(1.0, 1.0, 256)
    timings = {}
    for name, decoder in (("graphed", graphed), ("fused", fused), ("eager", eager)):
        run(decoder, ids, mask, spec, seed=2)  # warm-up (capture)
        tokens, _, seconds = run(decoder, ids, mask, spec, seed=2)
        timings[name] = {"seconds": round(seconds, 3), "steps": tokens.shape[1],
                         "ms_per_step": round(1000 * seconds / tokens.shape[1], 3),
                         "rows_x_steps_per_s": round(tokens.numel() / seconds)}
    result["batch_256"] = timings
    write(args.out, result)
    states = sorted(fused._states.items())  # (batch, length) -> state, smallest batch first
    result["step_kernels"] = {
        f"{name}_batch_{states[at][0][0]}": step_kernels(decoder, states[at][1])
        for name, decoder in (("eager", graphed), ("fused", fused)) for at in (0, -1)}
    result["replay_ms_by_batch"] = {"graphed": replay_ms(graphed), "fused": replay_ms(fused)}
    print(json.dumps(result, indent=1))
    write(args.out, result)


def write(path: str | None, result: dict) -> None:
    """Write what is measured so far (a timeout keeps it)."""
    if path:
        with open(path, "w") as handle:
            json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()
