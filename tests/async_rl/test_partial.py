"""Partial rollouts (``features.async_rl.partial_tokens``): the unfinished sequences of a step go
on with the next policy version, each token keeping the version and log-prob it was sampled
with; the switch is fixed by the step, so the run stays within the bound, deterministic and
resumable bit for bit."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from graft.config import compose
from graft.errors import ConfigError
from graft.rollout import SamplingSpec
from graft_async_rl.partial import PartialRollout, segment_seed, tail_version
from tests.async_rl.test_async_rl import RUN, deterministic, workers
from tests.core.rollout.test_seeded_sampling import tiny_rollout

PROMPTS = [[1, 70, 83], [1, 20, 21, 22, 23], [1, 30, 31, 32, 33, 34, 35, 36]]
SPEC = SamplingSpec(temperature=1.0, top_p=1.0, max_new_tokens=10, seeds=(11, 22, 33))


def test_partial_rollouts_need_an_older_version_to_switch_from() -> None:
    with pytest.raises(ConfigError, match=r"partial_tokens.*max_staleness=0.*max_staleness >= 1"):
        compose([*workers(1, 0), "features.async_rl.partial_tokens=4"])
    assert compose([*workers(1, 2), "features.async_rl.partial_tokens=4"])


@pytest.mark.parametrize(("step", "k", "tail"), [(1, 1, 0), (2, 1, 1), (5, 2, 3), (3, 4, 0)])
def test_a_step_switches_to_the_version_the_next_step_starts_with(step: int, k: int,
                                                                  tail: int) -> None:
    assert tail_version(step, k) == tail


def test_a_continuations_seed_is_its_own_and_the_first_part_keeps_the_samples() -> None:
    assert segment_seed(12345, 0) == 12345
    assert segment_seed(12345, 1) == segment_seed(12345, 1) != segment_seed(12346, 1)
    assert 0 <= segment_seed(2**63 - 1, 1) < 2**63


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory):
    """The embedded engine of an RL trainer of the tiny preset (CPU)."""
    return tiny_rollout(tmp_path_factory.mktemp("partial"))


def local(tensor: torch.Tensor) -> torch.Tensor:
    """A (possibly sharded) parameter's local tensor."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def own_logprobs(model: torch.nn.Module, sample) -> torch.Tensor:
    """The log-probs of ``sample``'s response under ``model`` now (one forward, no cache)."""
    sequence = torch.tensor([sample.prompt_ids + sample.response_ids])
    with torch.no_grad():
        logits = model(input_ids=sequence).logits[0, len(sample.prompt_ids) - 1:-1].float()
    return logits.log_softmax(-1).gather(-1, sequence[0, len(sample.prompt_ids):, None])[:, 0]


def test_unfinished_sequences_go_on_with_the_next_version_and_keep_their_log_probs(
        engine) -> None:
    model = engine.model
    original = {name: local(p).detach().clone() for name, p in model.named_parameters()}
    taken: list[int] = []

    def take_version(version: int) -> int:  # version 1: the weights scaled, as an update would
        if version > (taken[-1] if taken else 0):
            with torch.no_grad():
                for p in model.parameters():
                    p.mul_(1.05)
            engine.sync_weights()
        taken.append(version)
        return version

    eos = engine.eos_token_id
    partial = PartialRollout(engine, partial_tokens=4, max_staleness=1, eos_token_id=eos,
                             take_version=take_version)
    partial.step = 2  # starts with version 0, finishes with version 1
    prompts, seeds = PROMPTS * 3, tuple(range(100, 109))
    try:
        head_only = engine.generate(prompts, replace(SPEC, max_new_tokens=4, seeds=seeds))
        samples = partial.generate(prompts, replace(SPEC, seeds=seeds))
        assert taken == [0, 1]
        went_on = 0
        for sample, head, runs in zip(samples, head_only, partial.versions, strict=True):
            assert sample.response_ids[:4] == head.response_ids  # the draw before the switch
            torch.testing.assert_close(sample.logprobs[:len(head.response_ids)], head.logprobs)
            if len(head.response_ids) < 4 or head.response_ids[-1] == eos:
                assert sample.response_ids == head.response_ids
                assert runs == [(0, len(head.response_ids))]
                continue
            went_on += 1
            assert runs == [(0, 4), (1, len(sample.response_ids) - 4)]
            # after the switch, the tokens' log-probs are the new weights' (they drew them)
            torch.testing.assert_close(sample.logprobs[4:], own_logprobs(model, sample)[4:],
                                       rtol=0, atol=2e-5)
        assert went_on >= 3
    finally:
        with torch.no_grad():
            for name, p in model.named_parameters():
                local(p).copy_(original[name])
        engine.sync_weights()


def test_a_finished_sequence_does_not_go_on(engine) -> None:
    """EOS within the first part: the sample ends there, one run of versions."""
    first = engine.generate(PROMPTS[:1], replace(SPEC, max_new_tokens=4, seeds=(11,)))[0]
    eos = first.response_ids[1]  # pretend the second token ends the response
    partial = PartialRollout(engine, partial_tokens=4, max_staleness=1, eos_token_id=eos,
                             take_version=lambda version: version)
    partial.step = 3
    engine_eos, engine.eos_token_id = engine.eos_token_id, eos
    try:
        sample = partial.generate(PROMPTS[:1], replace(SPEC, seeds=(11,)))[0]
    finally:
        engine.eos_token_id = engine_eos
    assert sample.response_ids == first.response_ids[:2]
    assert partial.versions == [[(1, 2)]]


@pytest.mark.slow
def test_partial_workers_stay_within_the_bound_and_resume_bit_exactly(
        graft_train, metrics_of, tmp_path: Path) -> None:
    steps = ["trainer.total_steps=8", "checkpoint.every_steps=4",
             "features.async_rl.partial_tokens=4"]
    graft_train(tmp_path / "run", *RUN, *steps, *workers(1, 2), nproc=3)
    rows = metrics_of(tmp_path / "run")
    assert [row["step"] for row in rows] == list(range(1, 9))
    for row in rows:
        # the first 4 tokens of a step are min(k, t - 1) updates old, the rest one fewer
        assert row["async_rl/staleness_max"] == min(2, row["step"] - 1)
        if row["step"] >= 3:
            assert 1.0 < row["async_rl/staleness_mean"] < 2.0, row
        assert "rollout_correction/weight_mean" in row
    shutil.copytree(tmp_path / "run", tmp_path / "resumed")
    graft_train(tmp_path / "resumed", *RUN, *steps, *workers(1, 2),
                f"checkpoint.resume={tmp_path / 'resumed' / 'checkpoints' / 'step_4'}", nproc=3)
    resumed = metrics_of(tmp_path / "resumed")
    assert [deterministic(r) for r in resumed] == [deterministic(r) for r in rows]


@pytest.mark.vllm
def test_a_vllm_worker_continues_its_sequences_after_the_switch(
        requires_vllm: None, graft_train, metrics_of, tmp_path: Path) -> None:
    graft_train(tmp_path, *RUN, "trainer.total_steps=4", "rollout.engine=vllm",
                "features.async_rl.partial_tokens=4", *workers(1, 1), nproc=3)
    rows = metrics_of(tmp_path)
    assert [row["step"] for row in rows] == [1, 2, 3, 4]
    for row in rows[1:]:  # the first 4 tokens one update old, the rest none
        assert row["async_rl/staleness_max"] == 1.0
        assert 0.0 < row["async_rl/staleness_mean"] < 1.0, row
