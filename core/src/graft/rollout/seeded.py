"""Sampling keyed by each row's seed (``rollout.seeded_sampling``): the Gumbel-max draw.

A token is drawn as the argmax of ``logits / temperature`` (top-p filtered) plus Gumbel noise,
which samples from the same distribution as ``softmax`` would. The noise of a row at a position
is a hash of the row's seed, the position (tokens generated so far) and the token id, computed
with integer tensor operations: it depends on nothing else, neither the batch the row is in,
nor its padding, nor any generator's state.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

MASK32 = 0xFFFFFFFF
# Odd multipliers below 2**31, so a 32-bit value times one fits in int64 without overflow.
MIX = (0x7FEB352D, 0x2C1B3C6D, 0x297A2D39)


def mix32(value: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash, element-wise (``value``: int64 holding values below 2**32)."""
    for multiplier in MIX:
        value = value ^ (value >> 16)
        value = (value * multiplier) & MASK32
    return value ^ (value >> 15)


def token_keys(vocab: int, device: torch.device) -> torch.Tensor:
    """The hash of every token id (int64, ``(vocab,)``) that `gumbel_noise` mixes with a row's
    key: the same at every step, so a sampler computes it once."""
    return mix32(torch.arange(vocab, device=device, dtype=torch.int64) + 0x9E3779B)


def gumbel_noise(seeds: torch.Tensor, position: int, vocab: int,
                 tokens: torch.Tensor | None = None) -> torch.Tensor:
    """``(rows, vocab)`` float32 Gumbel noise for the ``seeds`` (int64, one per row, below 2**63)
    at generated position ``position``: a pure function of the three. ``tokens``: `token_keys`
    of ``vocab``, when the caller has them."""
    low, high = seeds & MASK32, (seeds >> 32) & MASK32
    row = mix32(mix32(low ^ mix32(high)) ^ position)
    if tokens is None:
        tokens = token_keys(vocab, seeds.device)
    bits = mix32(row[:, None] ^ tokens[None, :])
    uniform = (bits.double() + 0.5) / 2.0**32
    return (-torch.log(-torch.log(uniform))).float()


class SeededSampler:
    """A transformers logits processor that turns greedy ``generate`` into seeded sampling:
    temperature, top-p (the nucleus of ``softmax(logits / temperature)``, at least one token),
    then Gumbel noise keyed by each row's seed (`gumbel_noise`). Use it with
    ``do_sample=False``; the first call fixes where generation starts."""

    def __init__(self, seeds: Sequence[int], *, temperature: float, top_p: float,
                 device: torch.device) -> None:
        self.seeds = torch.tensor(list(seeds), dtype=torch.int64, device=device)
        self.temperature = temperature
        self.top_p = top_p
        self.start: int | None = None
        self.tokens: torch.Tensor | None = None  # `token_keys`, at the first call

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """The noisy scores whose argmax is the next token of each row."""
        if self.start is None:
            self.start = input_ids.shape[1]
        if self.tokens is None or self.tokens.numel() != scores.shape[-1]:
            self.tokens = token_keys(scores.shape[-1], scores.device)
        return seeded_scores(scores, self.seeds, input_ids.shape[1] - self.start,
                             temperature=self.temperature, top_p=self.top_p, tokens=self.tokens)


def seeded_scores(logits: torch.Tensor, seeds: torch.Tensor, position: int, *,
                  temperature: float, top_p: float,
                  tokens: torch.Tensor | None = None) -> torch.Tensor:
    """The ``(rows, vocab)`` fp32 scores whose argmax along the vocabulary is each row's seeded
    draw at generated position ``position`` (0 for a response's first token): ``logits /
    temperature`` (temperature > 0), top-p filtered when ``top_p`` < 1, plus `gumbel_noise` of
    the row's seed (``seeds``: int64, one per row). What a decode loop of a plugin
    (``graft_static_decoder``) calls to honour ``SamplingSpec.seeds`` with the core's tokens.
    ``tokens``: `token_keys` of the vocabulary, when the caller keeps them."""
    scaled = logits.float() / temperature
    if top_p < 1.0:
        scaled = top_p_filtered(scaled, top_p)
    return scaled + gumbel_noise(seeds, position, scaled.shape[-1], tokens)


def top_p_filtered(scaled: torch.Tensor, top_p: float) -> torch.Tensor:
    """``scaled`` logits with every token outside the nucleus set to -inf: the smallest set of
    most likely tokens whose probability reaches ``top_p`` (always the most likely one)."""
    ordered, order = scaled.sort(dim=-1, descending=True)
    before = ordered.softmax(dim=-1).cumsum(dim=-1) - ordered.softmax(dim=-1)
    dropped = before >= top_p
    dropped[..., 0] = False
    return scaled.masked_fill(dropped.scatter(-1, order, dropped), float("-inf"))
