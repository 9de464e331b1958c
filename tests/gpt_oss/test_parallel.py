"""Expert parallelism for GPT-OSS on 2 gloo ranks (fp32): EP=2 trains like EP=1, through the CLI
too; checkpoints reshard across ep sizes; a bad ep_size is a config error.

Tolerance: EP changes only the order of fp32 sums (the local experts as a loop of matmuls
instead of transformers' grouped_mm, expert outputs combined after an all-to-all, expert
gradients reduced over ``efsdp`` after a 1/ep scale), so gradients agree to ~1e-6 of each
tensor's largest entry (measured: 1.3e-6 at worst) and the losses of these 3 steps to the bit;
1e-5 leaves ten times that, while a wrong expert, a lost token or a missing 1/ep factor is an
O(1) difference.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from graft.errors import ConfigError
from graft.testing.families import check_hf_export
from graft_gpt_oss.parallel import check_ep_size

SFT = ("model.preset=tiny-gpt-oss", "trainer.mode=sft")


def test_ep2_losses_and_gradients_equal_ep1(ep_equivalence: dict) -> None:
    dense, split = ep_equivalence[1], ep_equivalence[2]
    assert split["losses"] == pytest.approx(dense["losses"], rel=1e-6)
    for step, (grads, ep_grads) in enumerate(zip(dense["grads"], split["grads"], strict=True)):
        assert grads.keys() == ep_grads.keys()
        for name, grad in grads.items():
            scale = float(grad.abs().max())
            torch.testing.assert_close(ep_grads[name], grad, rtol=0, atol=1e-5 * scale + 1e-12,
                                       msg=f"step {step + 1}: {name}")
    expert_grad = dense["grads"][0]["model.layers.1.mlp.experts.down_proj"]
    assert (expert_grad.flatten(1).abs().sum(1) > 0).sum() >= 6, "most experts must get tokens"


def test_ep_size_must_divide_the_experts() -> None:
    check_ep_size(8, 4)
    with pytest.raises(ConfigError, match=r"engine.ep_size=3 must divide the number of "
                                          r"experts \(8, num_local_experts\).*\[1, 2, 4, 8\]"):
        check_ep_size(8, 3)


@pytest.mark.slow
def test_ep_size_that_does_not_divide_the_experts_stops_the_run(run_graft) -> None:
    result = run_graft(["train", "--nproc", "2", *SFT, "engine.ep_size=2",
                        "+model.overrides.num_local_experts=5", "trainer.total_steps=1"])
    assert result.returncode != 0
    assert "engine.ep_size=2 must divide the number of experts (5" in result.stderr


def test_ep_size_that_does_not_divide_the_world_is_a_config_error(run_graft) -> None:
    result = run_graft(["train", *SFT, "engine.ep_size=2", "trainer.total_steps=1"])
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "engine.ep_size=2 must be a positive divisor of the world size 1" in result.stderr


@pytest.mark.slow
def test_sft_with_ep2_exports_exactly_and_resumes_with_ep1(graft_train, metrics_of,
                                                            tmp_path: Path) -> None:
    straight, resumed = tmp_path / "ep2", tmp_path / "ep1"
    graft_train(straight, *SFT, "engine.ep_size=2", "trainer.total_steps=4",
                "checkpoint.every_steps=2", nproc=2)
    check_hf_export(straight, "tiny-gpt-oss", step=4)  # fused experts assembled from ep blocks
    graft_train(resumed, *SFT, "engine.ep_size=1", "trainer.total_steps=4",
                f"checkpoint.resume={straight / 'checkpoints' / 'step_2'}", nproc=2)
    after, reference = metrics_of(resumed), metrics_of(straight)[2:]
    assert [row["step"] for row in after] == [3, 4]
    for row, expected in zip(after, reference, strict=True):
        assert row["loss"] == pytest.approx(expected["loss"], rel=1e-5)
        assert row["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-5)
    check_hf_export(resumed, "tiny-gpt-oss", step=4)


@pytest.mark.slow
def test_rl_default_runs_with_ep2(graft_train, metrics_of, tmp_path: Path) -> None:
    graft_train(tmp_path, "model.preset=tiny-gpt-oss", "engine.ep_size=2",
                "trainer.total_steps=2", "rollout.prompts_per_step=4", nproc=2)
    rows = metrics_of(tmp_path)
    assert [row["step"] for row in rows] == [1, 2]
    assert all(row["train_infer_logprob_diff"] < 1e-5 for row in rows)  # embedded: same model
    assert all(row["grad_norm"] > 0 for row in rows)
