"""Off-policy corrections (``algorithm.rollout_correction``): each formula on hand-computed
tensors, the weights stored in real micro-batches with their metrics, the registry with an
in-test plugin, the config rules, and short ``graft train`` runs with each built-in correction."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from graft import hookimpl
from graft.config import compose
from graft.engine.batch.micro_batch import TokenSample, build_micro_batch
from graft.errors import ConfigError
from graft.losses.contract import is_token_separable
from graft.losses.policy import ppo_clip_loss
from graft.rl.corrections import (
    PREFIX,
    WEIGHTS,
    apply_correction,
    icepop,
    mis,
    rollout_corrections,
    seq_mis,
    tis,
)
from graft.rl.job import rl_loss

LN = math.log
# two sequences of three tokens, the last token of the second is pad (mask 0)
ROLLOUT = torch.zeros(2, 3)
OLD = torch.tensor([[LN(0.5), LN(1.5), LN(3.0)], [LN(1.2), LN(2.0), 7.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
ALGO = SimpleNamespace(rollout_correction_cap=2.0, icepop_low=0.6, icepop_high=2.5)


def weights(fn) -> torch.Tensor:
    return fn(old_logp=OLD, rollout_logp=ROLLOUT, mask=MASK, cfg=ALGO)


def test_tis_truncates_each_token_ratio_at_the_cap() -> None:
    # min(r, 2); off the mask the log-ratio is 0 (r = 1), whatever the pad holds
    assert torch.allclose(weights(tis), torch.tensor([[0.5, 1.5, 2.0], [1.2, 2.0, 1.0]]))


def test_mis_masks_each_token_above_the_cap_and_keeps_the_others_ratio() -> None:
    # ratio 2.0 is kept (r <= C), ratio 3.0 masked
    assert torch.allclose(weights(mis), torch.tensor([[0.5, 1.5, 0.0], [1.2, 2.0, 1.0]]))


def test_seq_mis_masks_whole_sequences_by_their_product_ratio() -> None:
    # sequence 1: 0.5 * 1.5 * 3 = 2.25 > 2: every token 0; sequence 2: 1.2 * 2 = 2.4 > 2 too
    assert torch.equal(weights(seq_mis), torch.zeros(2, 3))
    low = SimpleNamespace(**{**vars(ALGO), "rollout_correction_cap": 2.3})
    got = seq_mis(old_logp=OLD, rollout_logp=ROLLOUT, mask=MASK, cfg=low)
    assert torch.allclose(got, torch.tensor([[2.25] * 3, [0.0] * 3]))


def test_icepop_masks_tokens_outside_its_range_on_both_sides() -> None:
    # [0.6, 2.5]: 0.5 and 3.0 are masked, the rest keep their ratio
    assert torch.allclose(weights(icepop), torch.tensor([[0.0, 1.5, 0.0], [1.2, 2.0, 1.0]]))


def test_the_rl_loss_multiplies_the_policy_loss_by_the_weights_and_stays_separable() -> None:
    cfg = compose(["algorithm.rollout_correction=tis", "loss.kl_coef=0.1"])
    logp = torch.tensor([[-1.0, -0.5, -2.0]])
    tensors = {"advantages": torch.tensor([[1.0, -1.0, 0.5]]),
               "old_logprobs": torch.tensor([[-1.1, -0.4, -2.0]]),
               "ref_logprobs": torch.tensor([[-1.0, -1.0, -1.0]]),
               WEIGHTS: torch.tensor([[0.5, 2.0, 0.0]])}
    loss_fn = rl_loss(cfg=cfg)
    loss, metrics = loss_fn(logp, tensors, torch.ones(1, 3))
    policy, _ = ppo_clip_loss(logp=logp, old_logp=tensors["old_logprobs"],
                              advantages=tensors["advantages"], mask=torch.ones(1, 3),
                              cfg=cfg.loss)
    # the KL penalty is not weighted
    assert torch.allclose(loss, policy * tensors[WEIGHTS] + 0.1 * metrics["kl"])
    assert is_token_separable(loss_fn)


def micro_batch(old: list[list[float]], rollout: list[list[float]]):
    # prompt of 2 tokens, responses of len(old[i]) tokens; label position t predicts t + 1
    samples = [TokenSample([1, 2, *range(3, 3 + len(o))], 2) for o in old]

    def aligned(values: list[float], length: int) -> torch.Tensor:
        out = torch.zeros(length)
        out[1:1 + len(values)] = torch.tensor(values)
        return out

    extras = {"old_logprobs": [aligned(o, len(s)) for o, s in zip(old, samples, strict=True)],
              "rollout_logprobs": [aligned(r, len(s)) for r, s in zip(rollout, samples,
                                                                       strict=True)]}
    return build_micro_batch(samples, packs_sequences=True, pad_token_id=0, extras=extras)


def test_apply_correction_stores_grid_weights_and_reports_them() -> None:
    batch = micro_batch([[LN(0.5), LN(3.0)], [LN(1.5), float("nan"), 0.0]],
                        [[0.0, 0.0], [0.0, 0.0, 0.0]])
    env = SimpleNamespace(device=torch.device("cpu"), dp_group=None, is_main=True)
    metrics = apply_correction([batch], tis, env, cfg=compose(["algorithm.rollout_correction=tis"]))
    got = batch.to_sequences(batch.tensors[WEIGHTS])
    mask = batch.to_sequences(batch.tensors["loss_mask"])
    # the NaN log-prob's weight is 0 (counted), never NaN; the pad and prompt are 0
    assert torch.allclose(got[mask != 0], torch.tensor([0.5, 2.0, 1.5, 0.0, 1.0]))
    assert torch.equal(batch.tensors[WEIGHTS] * (1 - batch.tensors["loss_mask"]),
                       torch.zeros_like(batch.tensors[WEIGHTS]))
    assert metrics[f"{PREFIX}weight_mean"] == pytest.approx(5.0 / 5)
    assert metrics[f"{PREFIX}weight_max"] == pytest.approx(2.0)
    assert metrics[f"{PREFIX}weight_min"] == 0.0
    assert metrics[f"{PREFIX}masked_fraction"] == pytest.approx(1 / 5)
    assert metrics[f"{PREFIX}truncated_fraction"] == pytest.approx(1 / 5)  # 3.0 -> 2.0
    assert metrics[f"{PREFIX}seq_masked_fraction"] == 0.0
    assert metrics[f"{PREFIX}nonfinite_fraction"] == pytest.approx(1 / 5)


def test_hook_graft_rollout_corrections_adds_a_selectable_correction(graft_plugin) -> None:
    class Halve:
        @hookimpl
        def graft_rollout_corrections(self):
            # gets only the keywords it names (off the mask its weights are dropped)
            return {"halve": lambda *, mask: torch.where(mask != 0, 0.5, math.inf)}

    graft_plugin(Halve(), name="halve")
    cfg = compose(["algorithm.rollout_correction=halve"])
    batch = micro_batch([[0.0, 0.0]], [[0.0, 0.0]])
    env = SimpleNamespace(device=torch.device("cpu"), dp_group=None, is_main=True)
    metrics = apply_correction([batch], rollout_corrections()["halve"], env, cfg=cfg)
    assert torch.allclose(batch.tensors[WEIGHTS].sum(), torch.tensor(1.0))
    assert metrics[f"{PREFIX}weight_mean"] == 0.5
    with pytest.raises(ConfigError, match="Did you mean 'halve'"):
        compose(["algorithm.rollout_correction=halv"])


def test_rules_refuse_an_empty_icepop_range_and_a_cap_of_zero() -> None:
    with pytest.raises(ConfigError, match="icepop_low=3.0 must be below"):
        compose(["algorithm.rollout_correction=icepop", "algorithm.icepop_low=3",
                 "algorithm.icepop_high=2"])
    with pytest.raises(ConfigError, match="rollout_correction_cap"):
        compose(["algorithm.rollout_correction_cap=0"])


def test_a_sequence_correction_keeps_the_fused_heads_loss_and_gradients() -> None:
    # the weights are computed per step, before the update: the loss stays token-separable, so
    # the fused head (which calls the loss on chunks of tokens) matches the chunked head
    from tests.core.engine.head.test_fused_head_loss import build, fused, unfused
    from tests.core.engine.head.test_fused_head_loss import micro_batch as model_batch

    model, family = build("tiny-llama")
    batch = model_batch(family, model.config.vocab_size)
    old = batch.tensors["old_logprobs"]
    noise = torch.randn(old.shape, generator=torch.Generator().manual_seed(1)) * 0.05
    batch.tensors["rollout_logprobs"] = old + noise
    cfg = compose(["algorithm.rollout_correction=seq_mis",
                   "algorithm.rollout_correction_cap=1.05"])
    env = SimpleNamespace(device=torch.device("cpu"), dp_group=None, is_main=True)
    metrics = apply_correction([batch], seq_mis, env, cfg=cfg)
    assert 0 < metrics[f"{PREFIX}seq_masked_fraction"] < 1, metrics
    loss_fn = rl_loss(cfg=cfg)
    _, loss, grads = unfused(model, family, batch, loss_fn, "token-mean", 16)
    _, loss_f, grads_f = fused(model, family, batch, loss_fn, "token-mean", 16)
    torch.testing.assert_close(loss_f, loss.float(), rtol=1e-6, atol=1e-7)
    assert grads_f.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grads_f[name], grad, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tis", "mis", "seq_mis", "icepop"])
def test_a_short_run_with_each_correction_logs_finite_metrics(name: str, graft_train, metrics_of,
                                                              tmp_path: Path) -> None:
    # the default task, shortened; one update per step: `auto` still recomputes the old
    # log-probs (the mismatch metric comes from that pass)
    graft_train(tmp_path, "trainer.total_steps=2", "rollout.prompts_per_step=4", "rollout.n=4",
                f"algorithm.rollout_correction={name}")
    rows = metrics_of(tmp_path)
    keys = ("weight_mean", "weight_max", "weight_min", "masked_fraction", "truncated_fraction",
            "seq_masked_fraction", "nonfinite_fraction")
    for row in rows:
        assert "train_infer_logprob_diff" in row
        for key in keys:
            assert math.isfinite(row[PREFIX + key]), (key, row)
        assert row[PREFIX + "nonfinite_fraction"] == 0.0
        assert 0 <= row[PREFIX + "weight_min"] <= row[PREFIX + "weight_max"]
        assert math.isfinite(row["loss"]) and row["skipped_updates"] == 0
