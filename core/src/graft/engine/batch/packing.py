"""Assigning samples to micro-batches under a token budget, balanced by attention workload.

The number of micro-batches is ``ceil(tokens / budget)`` or more (never fewer than
``min_micro_batches``, which lets data-parallel ranks agree on one count); samples go to
micro-batches longest-workload first, each to the least-loaded micro-batch it fits in, where the
workload of a sample of ``n`` tokens is ``linear_weight * n + n**2`` (linear layers plus causal
attention).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from graft.errors import DataError


def workload(length: int, linear_weight: int) -> int:
    """Relative compute cost of a sample of ``length`` tokens."""
    return linear_weight * length + length * length


def footprint(lengths: Sequence[int], *, packs_sequences: bool) -> int:
    """Tokens a micro-batch of samples of ``lengths`` occupies (0 when empty)."""
    return _footprint(len(lengths), sum(lengths), max(lengths, default=0),
                      packs_sequences=packs_sequences)


def _footprint(samples: int, total: int, longest: int, *, packs_sequences: bool) -> int:
    """The fit rule from a group's running counts: the sum when packed, else rows x longest
    (every sample its own row, padded to the longest)."""
    return total if packs_sequences else samples * longest


def plan_micro_batches(lengths: Sequence[int], *, token_budget: int, packs_sequences: bool,
                       linear_weight: int = 1024, min_micro_batches: int = 1) -> list[list[int]]:
    """Group sample indices into micro-batches; every group's footprint is <= ``token_budget``.

    Groups may be empty when ``min_micro_batches`` exceeds what the samples need. Raises
    `DataError` for a sample longer than the budget.
    """
    for index, length in enumerate(lengths):
        if length > token_budget:
            raise DataError(
                f"sample {index} has {length} tokens, more than the micro-batch token budget "
                f"engine.max_tokens_per_micro_batch={token_budget}; raise the budget or lower "
                f"data.max_prompt_tokens / data.max_response_tokens")
    count = max(min_micro_batches, math.ceil(sum(lengths) / token_budget) if lengths else 1)
    order = sorted(range(len(lengths)), key=lambda i: (-workload(lengths[i], linear_weight), i))
    while True:
        groups = _assign(order, lengths, count, token_budget, packs_sequences, linear_weight)
        if groups is not None:
            return [sorted(group) for group in groups]
        count += 1


def _assign(order: Sequence[int], lengths: Sequence[int], count: int, token_budget: int,
            packs_sequences: bool, linear_weight: int) -> list[list[int]] | None:
    groups: list[list[int]] = [[] for _ in range(count)]
    loads = [0] * count
    totals = [0] * count
    longest = [0] * count
    for index in order:
        length = lengths[index]
        # The group's footprint with this sample added, from running counts (O(1) per check).
        fitting = [g for g in range(count)
                   if _footprint(len(groups[g]) + 1, totals[g] + length, max(longest[g], length),
                                 packs_sequences=packs_sequences) <= token_budget]
        if not fitting:
            return None
        target = min(fitting, key=lambda g: (loads[g], g))
        groups[target].append(index)
        loads[target] += workload(length, linear_weight)
        totals[target] += length
        longest[target] = max(longest[target], length)
    return groups
