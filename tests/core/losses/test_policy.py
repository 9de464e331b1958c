"""PPO clip with dual clip, token by token."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from graft.losses.policy import ppo_clip_loss

CFG = SimpleNamespace(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)


def loss_for(ratio: float, advantage: float, cfg=CFG) -> float:
    logp = torch.tensor([[math.log(ratio)]])
    out, _ = ppo_clip_loss(logp=logp, old_logp=torch.zeros(1, 1),
                           advantages=torch.tensor([[advantage]]), mask=torch.ones(1, 1), cfg=cfg)
    return float(out)


def test_positive_advantage_is_clipped_above() -> None:
    assert abs(loss_for(1.1, 1.0) + 1.1) < 1e-6      # inside the clip range
    assert abs(loss_for(2.0, 1.0) + 1.28) < 1e-6     # clipped at 1 + 0.28
    assert abs(loss_for(0.5, 1.0) + 0.5) < 1e-6      # pessimistic: unclipped is larger


def test_negative_advantage_is_clipped_below_and_dual_clipped() -> None:
    assert abs(loss_for(0.5, -1.0) - 0.8) < 1e-6     # clipped at 1 - 0.2
    assert abs(loss_for(2.0, -1.0) - 2.0) < 1e-6     # below the dual-clip cap
    assert abs(loss_for(10.0, -1.0) - 3.0) < 1e-6    # capped at -A * c
    no_dual = SimpleNamespace(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=None)
    assert abs(loss_for(10.0, -1.0, no_dual) - 10.0) < 1e-5


def test_clip_fraction_metric() -> None:
    logp = torch.log(torch.tensor([[1.0, 2.0]]))
    _, metrics = ppo_clip_loss(logp=logp, old_logp=torch.zeros(1, 2), advantages=torch.ones(1, 2),
                               mask=torch.ones(1, 2), cfg=CFG)
    assert metrics["clip_fraction"].tolist() == [[0.0, 1.0]]
