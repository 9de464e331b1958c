"""Partial rollouts (``features.async_rl.partial_tokens``): after a step's first tokens, the
worker takes the next policy version and its in-flight sequences go on with the new weights.

A step t starts with the weights of `version_for` (t - 1 - k updates); once every sequence has
``partial_tokens`` tokens (or has ended), the worker applies version `tail_version` (t - k, the
version step t + 1 starts with, which it would otherwise wait for at the start of that step)
and generates the rest of the unfinished sequences with it: each continuation's prompt is the
prompt plus its tokens so far, so any rollout engine serves it. Each token keeps the log-prob
it was sampled with and its version (`TokenVersions`): the first tokens are k updates old, the
rest k - 1. Where the switch happens is fixed by the step and the setting, never by timing, so
a run stays deterministic and resumes bit for bit.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from typing import Any

import torch

from graft.rollout import RolloutSample, SamplingSpec
from graft_async_rl.roles import version_for

# A sample's token versions as runs: [(version, token count), ...] summing to its response
TokenVersions = list[tuple[int, int]]


def tail_version(step: int, max_staleness: int) -> int:
    """The policy version a partial rollout's step ``step`` finishes with: ``max(0, step -
    max_staleness)`` (the version the next step starts with)."""
    return max(0, step - max_staleness)


def segment_seed(seed: int, segment: int) -> int:
    """The seed a sample's ``segment``-th part is drawn with (below 2**63): its own seed for
    the first part, a hash of both for the others (a continuation is a new ``generate`` call
    whose positions count from 0 again)."""
    if segment == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}:{segment}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class PartialRollout:
    """A rollout engine whose ``generate`` switches weights part-way (the worker's ``job.rollout``
    in partial mode); everything else is the wrapped engine's."""

    def __init__(self, engine: Any, *, partial_tokens: int, max_staleness: int,
                 eos_token_id: int | None, take_version: Callable[[int], int]) -> None:
        self.engine = engine
        self.partial_tokens, self.k = partial_tokens, max_staleness
        self.eos_token_id = eos_token_id
        self.take_version = take_version  # applies versions up to the one given; returns it
        self.step = 0  # the RL step being generated (the worker sets it)
        self.versions: list[TokenVersions] = []  # of the last generate's samples

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def generate(self, prompts: list[list[int]], spec: SamplingSpec) -> list[RolloutSample]:
        """``spec.max_new_tokens`` tokens at most after each prompt: the first
        ``partial_tokens`` with the worker's weights, the rest after the switch."""
        head_version = self.take_version(version_for(self.step, self.k))
        head = dataclasses.replace(spec, max_new_tokens=min(self.partial_tokens,
                                                            spec.max_new_tokens))
        samples = self.engine.generate(prompts, head)
        self.versions = [[(head_version, len(s.response_ids))] for s in samples]
        tail = spec.max_new_tokens - head.max_new_tokens
        going = [row for row, s in enumerate(samples) if self._unfinished(s, head.max_new_tokens)]
        # the version the next step needs is taken now even when no sequence goes on
        tail_applied = self.take_version(tail_version(self.step, self.k))
        if tail > 0 and going:
            seeds = (None if spec.seeds is None
                     else tuple(segment_seed(spec.seeds[row], 1) for row in going))
            rest = self.engine.generate(
                [samples[row].prompt_ids + samples[row].response_ids for row in going],
                dataclasses.replace(spec, max_new_tokens=tail, seeds=seeds))
            for row, continuation in zip(going, rest, strict=True):
                samples[row] = _joined(samples[row], continuation)
                self.versions[row].append((tail_applied, len(continuation.response_ids)))
        return samples

    def _unfinished(self, sample: RolloutSample, budget: int) -> bool:
        """Whether ``sample`` used its whole budget without ending in EOS."""
        response = sample.response_ids
        return len(response) == budget and (self.eos_token_id is None
                                            or response[-1] != self.eos_token_id)


def _joined(head: RolloutSample, tail: RolloutSample) -> RolloutSample:
    """One sample of a head and its continuation (whose prompt is the head's whole sequence):
    their tokens and log-probs in order; per-token extras of the continuation (which cover the
    head's tokens as its prompt) kept."""
    logprobs = (None if head.logprobs is None or tail.logprobs is None
                else torch.cat([head.logprobs, tail.logprobs]))
    return RolloutSample(head.prompt_ids, head.response_ids + tail.response_ids, logprobs,
                         dict(tail.extras), dict(tail.engine_extras))
