"""CPU: peak memory and time of the log-prob head (LM head, temperature, log-prob, entropy;
forward + backward) at one length for several ``engine.logprob_chunk_tokens``.

The head of a Llama-3 vocabulary (128,256) on hidden states of width 1024 (fp32, CPU), 4096
tokens by default; ``0`` is today's path (the whole logits from the head, then
`graft.engine.head.logprobs.token_logprobs` / ``token_entropy``). Each setting runs in a fresh process,
whose peak resident memory above the inputs (``ru_maxrss``) is what the setting costs.

    python bench/logprob_chunks.py --hidden-size 256 --tokens 2048 --steps 1 \
        --chunks 0 256 512 1024 2048 --out bench/results/logprob_chunks_cpu.json

``--fused`` runs the chunked settings with the loss's gradient taken in the head's forward
(`graft.engine.head.fused_loss`, ``engine.fuse_loss_into_head``), ``--both`` each setting both
ways (each row says which).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

CHUNKS = (0, 512, 1024, 2048, 4096)


def run_one(chunk: int, tokens: int, hidden_size: int, vocab: int, steps: int,
            fused: bool = False) -> dict:
    """One setting in this process: its peak memory above the inputs and its mean step time."""
    import torch

    from graft.engine.head.chunked import chunked_head_logprobs
    from graft.engine.head.fused_loss import fused_head_loss
    from graft.engine.head.logprobs import token_entropy, token_logprobs

    torch.manual_seed(0)
    head = torch.nn.Linear(hidden_size, vocab, bias=False)
    hidden = torch.randn(tokens, hidden_size, requires_grad=True)
    labels = torch.randint(0, vocab, (tokens,))
    temperature = torch.full((tokens,), 0.9)
    base_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    for _ in range(steps + 1):
        started = time.perf_counter()
        if chunk and fused:
            logp, entropy, loss = fused_head_loss(head, hidden, labels, temperature,
                                                  lambda _tokens, logp: logp.sum(),
                                                  chunk_tokens=chunk, with_entropy=True)
        elif chunk:
            logp, entropy = chunked_head_logprobs(head, hidden, labels, temperature,
                                                  chunk_tokens=chunk, with_entropy=True)
        else:
            logits = head(hidden)
            logp, entropy = token_logprobs(logits, labels, temperature), \
                token_entropy(logits, temperature)
            del logits
        (loss if chunk and fused else logp.sum()).backward()
        times.append(time.perf_counter() - started)
        del logp, entropy
        head.weight.grad = hidden.grad = None
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"chunk_tokens": chunk, "fused": bool(chunk and fused), "tokens": tokens,
            "hidden_size": hidden_size, "vocab": vocab,
            "peak_above_inputs_gib": round((peak_kib - base_kib) / 2**20, 3),
            "step_s": round(sum(times[1:]) / steps, 3),
            "logits_fp32_gib": round(tokens * vocab * 4 / 2**30, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--hidden-size", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--chunks", type=int, nargs="*", default=list(CHUNKS))
    parser.add_argument("--fused", action="store_true", help="the loss's gradient in the head")
    parser.add_argument("--both", action="store_true", help="each chunked setting both ways")
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(run_one(args.one, args.tokens, args.hidden_size, args.vocab, args.steps,
                                 args.fused)))
        return
    rows = []
    ways = [False, True] if args.both else [args.fused]
    settings = [(chunk, fused) for chunk in args.chunks for fused in (ways if chunk else [False])]
    for chunk, fused in settings:
        out = subprocess.run([sys.executable, __file__, "--one", str(chunk), "--tokens",
                              str(args.tokens), "--hidden-size", str(args.hidden_size),
                              "--vocab", str(args.vocab), "--steps", str(args.steps),
                              *(["--fused"] if fused else [])],
                             check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
