"""GSPO (graft-gspo's policy loss, moved from tests/core/losses/test_gspo.py): value and gradient
against an independent per-sequence formula under every aggregation mode (built-in and a
plugin's), clip fractions, the clamp, rollout weights, the PPO-range warning, and
``loss.clip_ratio_c`` refused (GSPO has no dual clip)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

import graft
from graft import hookimpl
from graft.errors import ConfigError
from graft.losses import BUILTIN_AGG_MODES, AggregationContext, aggregate_loss
from graft.losses.registry import policy_losses
from graft_gspo import GspoConfig, gspo_loss, rollout_is_weights, warn_if_ppo_clip_range

PLUGIN_MODE = "seq-sum-token-mean"
LENGTHS = [5, 9, 0, 3, 12]  # one sequence without a response token


class SeqSumTokenMean:
    """A plugin's aggregation mode (docs/plugins.md's example)."""

    @hookimpl
    def graft_loss_agg_modes(self):
        return [PLUGIN_MODE]

    @hookimpl
    def graft_loss_aggregate(self, loss_mat, loss_mask, mode, ctx):
        if mode != PLUGIN_MODE:
            return None
        per_sequence = (loss_mat * loss_mask).sum(-1) / loss_mask.sum(-1).clamp(min=1)
        return per_sequence.sum() * ctx.dp_size


def batch(seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    width = max(LENGTHS) + 2
    mask = torch.zeros(len(LENGTHS), width, dtype=torch.float64)
    for row, length in enumerate(LENGTHS):
        mask[row, 1:1 + length] = 1.0
    old = -2.0 + 0.3 * torch.randn(mask.shape, generator=generator, dtype=torch.float64)
    # sequence log-ratios spread around 0 so that some are clipped on either side
    shift = torch.tensor([0.02, -0.03, 0.0, 0.001, -0.0005], dtype=torch.float64)
    logp = old + shift[:, None] + 0.01 * torch.randn(mask.shape, generator=generator,
                                                     dtype=torch.float64)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.7, 1.3], dtype=torch.float64)[:, None]
    return {"logp": logp, "old": old, "mask": mask,
            "advantages": advantages.expand_as(mask).contiguous(),
            "rollout": old + 0.05 * torch.randn(mask.shape, generator=generator,
                                                dtype=torch.float64)}


def loss_config(low: float = 0.01, high: float = 0.015,
                rollout_is: str = "none") -> tuple[SimpleNamespace, SimpleNamespace]:
    """(``cfg.loss``, the root config) as the trainer passes them: the clip range in the loss
    section, the rollout weights in ``features.gspo``."""
    loss = SimpleNamespace(clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=None)
    gspo = GspoConfig(rollout_is=rollout_is, rollout_is_cap=2.0)
    return loss, SimpleNamespace(loss=loss, features=SimpleNamespace(gspo=gspo))


def per_sequence_reference(data: dict, mode: str, ctx: AggregationContext, low: float,
                           high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """GSPO written per sequence: l_i = max(-A s_i, -A clip(s_i)); sum modes weight it by the
    sequence's token count, mean modes by 1; then the mode's normaliser."""
    logp = data["logp"].clone().requires_grad_()
    mask = data["mask"]
    total = logp.new_zeros(())
    for row in range(mask.shape[0]):
        valid = mask[row] != 0
        count = int(valid.sum())
        if count == 0:
            continue
        s = torch.exp((logp[row][valid] - data["old"][row][valid]).mean())
        a = data["advantages"][row, 0]
        seq_loss = torch.maximum(-a * s, -a * s.clamp(1 - low, 1 + high))
        weight = {"token-mean": count / ctx.global_tokens, "token-sum": count,
                  "seq-mean-token-sum": count / ctx.global_sequences,
                  "seq-mean-token-mean": 1 / ctx.global_sequences,
                  "seq-mean-token-sum-norm": count / ctx.loss_scale_factor / ctx.global_sequences,
                  PLUGIN_MODE: 1}[mode]
        total = total + weight * seq_loss
    total.backward()
    return total.detach(), logp.grad


def through_the_core(data: dict, mode: str, ctx: AggregationContext, manager,
                     **config) -> tuple[torch.Tensor, torch.Tensor, dict]:
    logp = data["logp"].clone().requires_grad_()
    loss_cfg, root_cfg = loss_config(**config)
    loss_mat, metrics = gspo_loss(logp=logp, old_logp=data["old"], advantages=data["advantages"],
                                  mask=data["mask"], cfg=loss_cfg, root_cfg=root_cfg,
                                  tensors={"rollout_logprobs": data["rollout"]})
    value = aggregate_loss(loss_mat, data["mask"], mode, ctx, manager)
    value.backward()
    return value.detach(), logp.grad, metrics


@pytest.mark.parametrize("mode", [*BUILTIN_AGG_MODES, PLUGIN_MODE])
def test_value_and_gradient_match_the_per_sequence_formula(graft_plugin, mode: str) -> None:
    manager = graft_plugin(SeqSumTokenMean(), name="seq-sum")
    data = batch()
    ctx = AggregationContext(global_tokens=float(data["mask"].sum()), global_sequences=4.0,
                             dp_size=1, loss_scale_factor=16.0)
    value, grad, metrics = through_the_core(data, mode, ctx, manager)
    expected, expected_grad = per_sequence_reference(data, mode, ctx, 0.01, 0.015)
    torch.testing.assert_close(value, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-10, atol=1e-12)
    assert grad.abs().sum() > 0
    clipped = metrics["clip_fraction"].sum(-1) > 0
    assert clipped.tolist() == [True, True, False, False, False], "sequences 0 and 1 clip"


def test_clip_fractions_are_reported_per_side() -> None:
    data = batch()
    _, _, metrics = through_the_core(data, "token-mean", AggregationContext(1.0, 1.0, 1, 1.0),
                                     None)
    mask = data["mask"]
    upper = (metrics["clip_fraction_upper"] * mask).sum(-1)
    lower = (metrics["clip_fraction_lower"] * mask).sum(-1)
    # sequence 0: A > 0, ratio ~exp(0.02) above 1 + high; sequence 1: A < 0, below 1 - low
    assert upper.tolist() == [LENGTHS[0], 0, 0, 0, 0]
    assert lower.tolist() == [0, LENGTHS[1], 0, 0, 0]
    assert torch.equal(metrics["clip_fraction"], metrics["clip_fraction_lower"]
                       + metrics["clip_fraction_upper"])
    seq_ratio = metrics["seq_ratio"]
    assert torch.allclose(seq_ratio[0, 1:6], seq_ratio[0, 1].expand(5)), "one value per sequence"


def test_the_log_ratio_is_clamped_at_10() -> None:
    data = batch()
    data["logp"] = data["old"] + 50.0
    _, grad, metrics = through_the_core(data, "token-mean", AggregationContext(1.0, 1.0, 1, 1.0),
                                        None, low=100.0, high=1e6)
    assert metrics["seq_ratio"].max() == torch.exp(torch.tensor(10.0, dtype=torch.float64))
    assert grad.abs().max() == 0, "clamped: no gradient"


def test_rollout_importance_weights_multiply_the_loss() -> None:
    data = batch()
    ctx = AggregationContext(1.0, 1.0, 1, 1.0)
    plain, _, _ = through_the_core(data, "token-sum", ctx, None)
    for level in ("token", "sequence"):
        weighted, _, metrics = through_the_core(data, "token-sum", ctx, None, rollout_is=level)
        weights = rollout_is_weights(data["old"], data["rollout"], data["mask"], level=level,
                                     cap=2.0)
        assert torch.equal(metrics["rollout_is_weight"], weights)
        assert not torch.isclose(weighted, plain)
    sequence = rollout_is_weights(data["old"], data["rollout"], data["mask"], level="sequence",
                                  cap=2.0)
    row = sequence[0][data["mask"][0] != 0]
    assert torch.equal(row, row[0].expand_as(row))
    capped = rollout_is_weights(data["old"] + 5.0, data["rollout"], data["mask"], level="token",
                                cap=2.0)
    assert capped[data["mask"] != 0].max() == 2.0


def test_a_ppo_like_clip_range_is_warned_about_once(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="graft.losses")
    warn_if_ppo_clip_range.cache_clear()
    warn_if_ppo_clip_range(3e-4, 4e-4)
    assert not caplog.records
    warn_if_ppo_clip_range(0.2, 0.28)
    warn_if_ppo_clip_range(0.2, 0.28)
    assert len(caplog.records) == 1
    assert "look like PPO's" in caplog.text and "clip_ratio_low=3e-4" in caplog.text


def test_gspo_is_a_policy_loss_of_the_plugin() -> None:
    assert policy_losses()["gspo"] is gspo_loss
    cfg = graft.compose(["loss.policy_loss=gspo", "loss.clip_ratio_c=null",
                         "features.gspo.rollout_is=sequence", "features.gspo.rollout_is_cap=1.5"])
    assert cfg.features.gspo == GspoConfig(rollout_is="sequence", rollout_is_cap=1.5)


def test_dual_clip_with_gspo_is_a_config_error() -> None:
    """GSPO has no dual clip (verl's neither): a clip_ratio_c the user set, which it would
    ignore, is refused; the default is turned off (test_dual_clip.py)."""
    with pytest.raises(ConfigError, match=r"loss.policy_loss=gspo has no dual clip, so "
                                          r"loss.clip_ratio_c=3.0 would be ignored.*set "
                                          r"loss.clip_ratio_c=null"):
        graft.compose(["loss.policy_loss=gspo", "loss.clip_ratio_c=3.0"])
    graft.compose(["loss.policy_loss=ppo", "loss.clip_ratio_c=3.0"])  # PPO's dual clip


def test_the_rollout_weight_cap_must_be_positive() -> None:
    with pytest.raises(ConfigError, match=r"features\.gspo\.rollout_is_cap"):
        graft.compose(["features.gspo.rollout_is_cap=0"])
