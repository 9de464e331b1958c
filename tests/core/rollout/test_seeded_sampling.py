"""``rollout.seeded_sampling``: each row drawn with its own seed (`graft.rollout.seeded`'s
Gumbel-max draw, ``SamplingSpec.seeds``) gets the same tokens whatever batch it is in, on the
embedded engine (the tiny preset on CPU); the noise is a pure function of (seed, position,
vocab) and its draw follows ``softmax``; `graft.rl.sample_seed` is stable; 1 and 2 colocated
ranks draw the same samples. No graft-async-rl."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from graft.config import compose
from graft.rl import sample_seed
from graft.rollout import SamplingSpec
from graft.rollout.seeded import gumbel_noise, top_p_filtered
from graft.training.trainer import Trainer

SPEC = SamplingSpec(temperature=1.0, top_p=1.0, max_new_tokens=6)
SHORT, MIDDLE, LONG = [1, 70, 83], [1, 20, 21, 22, 23], [1, 30, 31, 32, 33, 34, 35, 36]


def tiny_rollout(run_dir: Path):
    """The embedded engine of an RL trainer of the tiny preset (dynamic decode on CPU)."""
    trainer = Trainer(compose([f"trainer.run_dir={run_dir}", "engine.device=cpu",
                               "trainer.total_steps=1", "checkpoint.every_steps=0",
                               "export.hf_at_end=false"]))
    return trainer.job.rollout


@pytest.fixture(scope="module")
def rollout(tmp_path_factory: pytest.TempPathFactory):
    """`tiny_rollout`: the engine itself draws (no static decode loop)."""
    engine = tiny_rollout(tmp_path_factory.mktemp("seeded"))
    assert engine.kind == "embedded" and engine.decoder is None
    return engine


def draw(rollout, prompts: list[list[int]], seeds: tuple[int, ...], *,
         generator_seed: int = 0, spec: SamplingSpec = SPEC) -> list[tuple[list[int], list]]:
    """Each row's response and log-probs, after reseeding torch's generator (which seeded
    sampling must not read)."""
    torch.manual_seed(generator_seed)
    samples = rollout.generate(prompts, replace(spec, seeds=seeds))
    return [(s.response_ids, s.logprobs) for s in samples]


def same(a: tuple[list[int], torch.Tensor], b: tuple[list[int], torch.Tensor]) -> bool:
    return a[0] == b[0] and torch.allclose(a[1], b[1], atol=1e-5)


def test_a_seed_draws_the_same_tokens_whatever_rows_and_padding_surround_it(rollout) -> None:
    alone_short = draw(rollout, [SHORT], (11,))[0]
    alone_middle = draw(rollout, [MIDDLE], (22,), generator_seed=5)[0]
    # left-padded among longer prompts, in another order, with other rows' seeds
    batch = draw(rollout, [LONG, SHORT, MIDDLE], (33, 11, 22), generator_seed=7)
    assert same(batch[1], alone_short) and same(batch[2], alone_middle)
    swapped = draw(rollout, [MIDDLE, SHORT, SHORT], (22, 11, 44), generator_seed=9)
    assert same(swapped[0], alone_middle) and same(swapped[1], alone_short)
    # the same prompt twice in one batch with one seed: twice the same tokens
    twice = draw(rollout, [SHORT, LONG, SHORT], (11, 33, 11))
    assert same(twice[0], alone_short) and same(twice[2], alone_short)
    # top-p too: the nucleus is the row's own
    nucleus = replace(SPEC, top_p=0.9)
    assert same(draw(rollout, [SHORT, LONG], (5, 6), spec=nucleus)[0],
                draw(rollout, [SHORT], (5,), spec=nucleus, generator_seed=3)[0])


def test_different_seeds_draw_different_tokens(rollout) -> None:
    responses = [response for response, _ in draw(rollout, [SHORT] * 8, tuple(range(8)))]
    assert len({tuple(r) for r in responses}) >= 6, responses


def test_gumbel_noise_is_a_pure_function_of_seed_position_and_vocab() -> None:
    seeds = torch.tensor([0, 1, 2**62 + 12345, 2**63 - 1], dtype=torch.int64)
    noise = gumbel_noise(seeds, 3, 50)
    assert noise.shape == (4, 50) and noise.dtype == torch.float32 and noise.isfinite().all()
    assert torch.equal(noise, gumbel_noise(seeds.clone(), 3, 50))  # no state read
    # a row's noise is its seed's alone: not its row, not the other rows
    assert torch.equal(gumbel_noise(seeds.flip(0), 3, 50), noise.flip(0))
    assert torch.equal(gumbel_noise(seeds[2:3], 3, 50), noise[2:3])
    # a token's noise does not depend on the vocabulary's size
    assert torch.equal(gumbel_noise(seeds, 3, 20), noise[:, :20])
    # another position, another seed (high bits alone too): other noise
    assert not torch.equal(gumbel_noise(seeds, 4, 50), noise)
    assert not torch.equal(gumbel_noise(seeds + 2**40, 3, 50), noise)
    assert len({tuple(row.tolist()) for row in noise}) == 4


def test_the_gumbel_max_draw_follows_softmax() -> None:
    """20000 fixed seeds at two positions: the argmax of logits + noise falls on each of 5
    tokens as often as softmax says (chi-square, 4 degrees of freedom, loose bound), and the
    noise has the standard Gumbel's mean and variance."""
    logits = torch.tensor([0.0, 1.0, 2.0, -1.0, 0.5])
    expected = logits.softmax(-1).double() * 20000
    seeds = torch.arange(20000, dtype=torch.int64) * 7919 + 3
    for position in (0, 9):
        noise = gumbel_noise(seeds, position, 5)
        counts = torch.bincount((logits + noise).argmax(-1), minlength=5).double()
        chi_square = float(((counts - expected) ** 2 / expected).sum())
        assert chi_square < 30.0, (position, counts.tolist(), expected.tolist())
        assert float(noise.mean()) == pytest.approx(0.5772, abs=0.02)  # Euler's gamma
        assert float(noise.var()) == pytest.approx(math.pi ** 2 / 6, abs=0.05)


def test_top_p_keeps_the_nucleus() -> None:
    probs = torch.tensor([[0.1, 0.45, 0.3, 0.15],
                          [0.3, 0.15, 0.1, 0.45]])  # the same distribution, tokens permuted
    scaled = probs.log()

    def kept(top_p: float) -> list[list[int]]:
        filtered = top_p_filtered(scaled, top_p)
        assert torch.equal(filtered[filtered.isfinite()], scaled[filtered.isfinite()])
        return [row.isfinite().nonzero().flatten().tolist() for row in filtered]

    assert kept(0.7) == [[1, 2], [0, 3]]  # 0.45 + 0.3 reaches 0.7
    assert kept(0.8) == [[1, 2, 3], [0, 1, 3]]
    assert kept(0.4) == [[1], [3]]  # the most likely token alone reaches it
    assert kept(0.01) == [[1], [3]]  # always the most likely token
    assert kept(1.0) == [[0, 1, 2, 3]] * 2


def test_sample_seed_is_stable_and_each_field_counts() -> None:
    assert sample_seed(1234, 7, 42, 3) == 2726952923042612080  # never changes: resumes rely on it
    assert sample_seed(0, 1, 0, 0) == 6316595022706419701
    base = (1234, 7, 42, 3)
    seeds = {sample_seed(*base)}
    for field in range(4):
        changed = list(base)
        changed[field] += 1
        seeds.add(sample_seed(*changed))
    assert len(seeds) == 5
    assert sample_seed(1, 23, 4, 5) != sample_seed(12, 3, 4, 5)  # fields do not run together
    assert all(0 <= seed < 2**63 for seed in seeds)


@pytest.mark.slow  # two graft train processes (~15 s on 2 cores)
def test_one_and_two_colocated_ranks_draw_the_same_samples(graft_train, metrics_of,
                                                           tmp_path: Path) -> None:
    """64 samples a step, so some end early and some score (unseeded, 1 and 2 ranks differ
    here); the first prompt's responses are in both runs' samples.jsonl."""
    run = ("rollout.seeded_sampling=true", "trainer.total_steps=3", "rollout.prompts_per_step=8",
           "rollout.n=8", "trainer.log_samples=1", "trainer.log_sample_responses=all",
           "checkpoint.every_steps=0", "checkpoint.save_at_end=false", "export.hf_at_end=false")
    graft_train(tmp_path / "one", *run)
    graft_train(tmp_path / "two", *run, nproc=2)
    one, two = metrics_of(tmp_path / "one"), metrics_of(tmp_path / "two")
    assert [row["step"] for row in two] == [1, 2, 3]
    assert any(row["reward_mean"] > 0 and row["response_length"] < 8 for row in one)
    for a, b in zip(one, two, strict=True):
        for name in ("reward_mean", "response_length", "response_length_min"):
            assert b[name] == pytest.approx(a[name], abs=1e-9), (a["step"], name)
    samples = [(tmp_path / run_dir / "samples.jsonl").read_text() for run_dir in ("one", "two")]
    assert samples[0] == samples[1] and samples[0].count("\n") == 3 * 8
