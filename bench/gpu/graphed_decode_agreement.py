"""Where Graft's graphed decode loop and the same loop run eagerly part ways on a GPU: the
TinyLlama-1.1B-shaped model of `graphed_decode_check.py`, 64 left-padded prompts of 8-40
tokens, 64 new tokens, same generator state; for each row the first step whose token differs,
and how far the log-probs are apart before it. Variants: the loop as it is; with a memory pool
per graph (it shares one); one attended length per batch (the whole cache,
``ATTENDED_LENGTHS = 1``); the eager loop twice (its own determinism). Eager kernels only (no
inductor), so the run takes about a minute.

    python3 bench/gpu/graphed_decode_agreement.py --out $OUT/graphed_decode_agreement.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from graphed_decode_check import prompts, run, tinyllama, write

import graft_graphed_decode.decoder as graphed_decode
from graft.rollout import SamplingSpec
from graft_graphed_decode.decoder import GraphedDecoder


def first_differences(tokens: torch.Tensor, other: torch.Tensor, logprobs: torch.Tensor,
                      other_logprobs: torch.Tensor) -> dict:
    """Per row, the first step whose token differs (None: none), and the largest log-prob
    difference over the steps before the first difference of any row."""
    differs = tokens != other
    first = [int(row.nonzero()[0]) if row.any() else None for row in differs]
    agreed = min([f for f in first if f is not None], default=tokens.shape[1])
    diff = (logprobs[:, :agreed] - other_logprobs[:, :agreed]).abs()
    return {"first_differing_step_per_row": first, "steps_all_rows_agree": agreed,
            "max_logprob_diff_before": float(diff.max()) if diff.numel() else None,
            "equal_logprob_fraction_before": float((diff == 0).float().mean())
            if diff.numel() else None}


class PoolPerGraph(GraphedDecoder):
    """The loop with a memory pool of its own for every graph (it shares one)."""

    def _capture(self, state, attended: int) -> None:
        self._graph_pool = None
        super()._capture(state, attended)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    model = tinyllama()
    ids, mask = prompts(64, torch.Generator().manual_seed(0))
    spec = SamplingSpec(1.0, 1.0, 64)
    result = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
              "device": torch.cuda.get_device_name()}
    eager = GraphedDecoder(model, pad_token_id=0, eos_token_id=2, use_graphs=False)
    e_tokens, e_logprobs, _ = run(eager, ids, mask, spec, seed=1)
    again_tokens, again_logprobs, _ = run(eager, ids, mask, spec, seed=1)
    result["eager_twice"] = first_differences(e_tokens, again_tokens, e_logprobs, again_logprobs)
    variants = (("graphed", graphed_decode.ATTENDED_LENGTHS, GraphedDecoder),
                ("graphed_pool_per_graph", graphed_decode.ATTENDED_LENGTHS, PoolPerGraph),
                ("graphed_whole_cache", 1, GraphedDecoder))
    for name, lengths, decoder_class in variants:
        graphed_decode.ATTENDED_LENGTHS = lengths  # read by both loops at every rollout
        graphed = decoder_class(model, pad_token_id=0, eos_token_id=2, use_graphs=True)
        g_tokens, g_logprobs, _ = run(graphed, ids, mask, spec, seed=1)
        e_tokens, e_logprobs, _ = run(eager, ids, mask, spec, seed=1)
        result[name] = {"attended_lengths": graphed._attended_lengths(128),
                        **first_differences(g_tokens, e_tokens, g_logprobs, e_logprobs)}
        write(args.out, result)
        del graphed
        torch.cuda.empty_cache()
    print(json.dumps(result, indent=1))
    write(args.out, result)


if __name__ == "__main__":
    main()
