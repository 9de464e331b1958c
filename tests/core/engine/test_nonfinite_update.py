"""A non-finite loss or gradient never reaches the optimizer: the update is skipped (weights and
optimizer state unchanged), counted in skipped_updates and said on the console; a non-finite
advantage stops the run naming the estimator."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from graft import hookimpl
from graft.config import compose
from graft.errors import PluginError
from graft.losses.policy import ppo_clip_loss
from graft.rl import AdvantageEstimator
from graft.rl.advantages import compute_advantages


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for name, p in model.named_parameters()}


def _run(tmp_path: Path, policy_loss: str) -> tuple[list[dict], dict, dict, object]:
    from graft.training.trainer import Trainer

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"say {i}:", "answer": str(i)}) + "\n"
                            for i in range(4)))
    cfg = compose([f"trainer.run_dir={tmp_path / policy_loss}", "trainer.total_steps=1",
                   "engine.device=cpu", "model.preset=tiny-llama", "data.source=file",
                   f"data.path={data}", "algorithm.reward=exact_match", "optim.lr=1e-2",
                   f"loss.policy_loss={policy_loss}", "rollout.prompts_per_step=2",
                   "rollout.n=2", "rollout.max_new_tokens=3", "trainer.val_every_steps=0",
                   "checkpoint.save_at_end=false", "export.hf_at_end=false"])
    trainer = Trainer(cfg)
    before = _weights(trainer.engine.model)
    metrics = trainer.fit()
    return metrics, before, _weights(trainer.engine.model), trainer.engine.optimizer


class Losses:
    @hookimpl
    def graft_policy_losses(self):
        def nan_loss(*, logp, old_logp, advantages, mask, cfg):
            loss, metrics = ppo_clip_loss(logp=logp, old_logp=old_logp, advantages=advantages,
                                          mask=mask, cfg=cfg)
            return loss * float("nan"), metrics

        def moving_loss(*, logp, mask):  # a loss with a gradient whatever the rewards
            return -logp, {}

        return {"nan_loss": nan_loss, "moving_loss": moving_loss}


def test_a_nan_loss_skips_the_update(graft_plugin, tmp_path: Path,
                                     capsys: pytest.CaptureFixture) -> None:
    graft_plugin(Losses(), name="losses")
    (metrics,), before, after, optimizer = _run(tmp_path, "nan_loss")
    assert all(torch.equal(before[name], after[name]) for name in before)
    assert not optimizer.state  # Adam never stepped: no moments, no step count
    assert math.isnan(metrics["grad_norm"]) and metrics["skipped_updates"] == 1.0
    assert ("update skipped: the gradient norm is nan (a non-finite loss or gradient); the "
            "weights and the optimizer state are unchanged") in capsys.readouterr().out


def test_a_finite_loss_updates(graft_plugin, tmp_path: Path) -> None:
    graft_plugin(Losses(), name="losses")
    (metrics,), before, after, optimizer = _run(tmp_path, "moving_loss")
    assert metrics["skipped_updates"] == 0.0 and math.isfinite(metrics["grad_norm"])
    assert not all(torch.equal(before[name], after[name]) for name in before)
    assert all(torch.isfinite(value).all() for value in after.values())


def test_non_finite_advantages_name_the_estimator() -> None:
    def broken(rewards, group_size):
        return rewards / (rewards - rewards)  # 0 / 0

    with pytest.raises(PluginError, match=r"^the advantages of 4 of 4 samples of this step are "
                                          r"not finite \(sample 0: inf; samples \[0, 1, 2, 3\]\), "
                                          r"so no update may use them \(advantage estimator "
                                          r".*broken\)$"):
        compute_advantages(AdvantageEstimator(broken), torch.tensor([1.0, 0.0, 1.0, 0.0]),
                           group_size=2, cfg=compose([]))
    with pytest.raises(PluginError, match=r"^the rewards of 1 of 2 samples .*\(sample 1: inf;"):
        compute_advantages(AdvantageEstimator(broken), torch.tensor([1.0, math.inf]),
                           group_size=2, cfg=compose([]))
