"""Micro-batch planning: token budget, balance, equal counts across ranks, clear errors."""

from __future__ import annotations

import random

import pytest

from graft.engine.batch.packing import footprint, plan_micro_batches, workload
from graft.errors import DataError


def test_every_micro_batch_respects_the_budget_and_every_sample_is_used() -> None:
    rng = random.Random(0)
    lengths = [rng.randint(10, 900) for _ in range(200)]
    for packs in (True, False):
        groups = plan_micro_batches(lengths, token_budget=2048, packs_sequences=packs)
        assert sorted(i for g in groups for i in g) == list(range(200))
        for group in groups:
            assert footprint([lengths[i] for i in group], packs_sequences=packs) <= 2048


def test_micro_batches_are_balanced_by_workload() -> None:
    rng = random.Random(1)
    lengths = [rng.randint(10, 1000) for _ in range(256)]
    groups = plan_micro_batches(lengths, token_budget=8192, packs_sequences=True)
    loads = [sum(workload(lengths[i], 1024) for i in g) for g in groups]
    assert max(loads) / min(loads) < 1.15


def test_minimum_count_is_honoured_with_empty_groups() -> None:
    groups = plan_micro_batches([5, 6], token_budget=100, packs_sequences=True, min_micro_batches=4)
    assert len(groups) == 4 and sum(len(g) for g in groups) == 2


def test_sample_longer_than_the_budget_is_a_clear_error() -> None:
    with pytest.raises(DataError, match="sample 1 has 300 tokens.*max_tokens_per_micro_batch=256"):
        plan_micro_batches([10, 300], token_budget=256, packs_sequences=True)
