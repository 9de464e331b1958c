"""Expert parallelism through the core's seams, with the test plugin `graft-moe-ep-plugin` (a
qwen3_moe family whose ``parallelize`` uses `graft.engine.distributed.expert_parallel`), on 2 and 4 gloo
ranks: the same losses and gradient norms as ``ep_size=1``, an export bit-equal to the one made
from its checkpoint, and a checkpoint saved with ``ep_size=2`` resumed with ``ep_size=1``.

Tolerance: EP changes only the order of fp32 sums (expert outputs combined after an all-to-all,
expert gradients reduced over ``efsdp`` after a 1/ep scale), so values agree to ~1e-7 relative;
1e-5 leaves room without hiding a wrong expert or a factor (a missing 1/ep doubles the expert
gradients' share of the norm).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

# RL on the tiny Qwen3-MoE (8 experts, top-2), the default task: non-zero advantages every step.
STEPS = ("trainer.total_steps=3", "checkpoint.every_steps=3", "rollout.prompts_per_step=8",
         "algorithm.mini_batches=2")


@pytest.fixture
def ep_train(run_graft, plugin_sites):
    """``graft train --nproc N engine.ep_size=EP`` with the EP test plugin installed."""

    def train(run_dir: Path, *args: str, nproc: int, ep: int) -> list[dict]:
        result = run_graft(["train", "--nproc", str(nproc), f"engine.ep_size={ep}",
                            f"trainer.run_dir={run_dir}", *args], site=plugin_sites["moe_ep"],
                           timeout=600)
        assert result.returncode == 0, result.stderr[-4000:]
        return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]

    return train


def assert_same_training(a: list[dict], b: list[dict]) -> None:
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for x, y in zip(a, b, strict=True):
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-5, abs=1e-7), (x["step"], "loss")
        assert x["grad_norm"] == pytest.approx(y["grad_norm"], rel=1e-5), (x["step"], "grad_norm")
        assert x["reward_mean"] == y["reward_mean"], x["step"]  # same samples were drawn


def hf_weights(folder: Path) -> dict[str, torch.Tensor]:
    weights = {}
    for file in sorted(folder.glob("*.safetensors")):
        weights.update(load_file(file))
    return weights


@pytest.mark.slow
def test_two_ranks_ep2_trains_like_ep1_and_exports_exactly(ep_train, run_graft,
                                                            tmp_path: Path) -> None:
    dense = ep_train(tmp_path / "ep1", *STEPS, nproc=2, ep=1)
    split = ep_train(tmp_path / "ep2", *STEPS, nproc=2, ep=2)
    assert_same_training(dense, split)
    assert sum(r["grad_norm"] > 0.05 for r in split) >= 2, "the run must learn to compare"

    # The live export streamed expert blocks (global ids); the checkpoint export gathers nothing.
    from_checkpoint = tmp_path / "from_ckpt"
    result = run_graft(["export", "--ckpt", str(tmp_path / "ep2" / "checkpoints" / "step_3"),
                        "--out", str(from_checkpoint)])
    assert result.returncode == 0, result.stderr[-3000:]
    live, reference = hf_weights(tmp_path / "ep2" / "hf"), hf_weights(from_checkpoint)
    assert live.keys() == reference.keys()
    assert {f"model.layers.1.mlp.experts.{i}.down_proj.weight" for i in range(8)} <= live.keys()
    for name, tensor in reference.items():
        assert torch.equal(live[name], tensor), name


@pytest.mark.slow
def test_four_ranks_with_experts_split_in_two_train_alike(ep_train, tmp_path: Path) -> None:
    """ep=2 on 4 ranks: a 2-D expert mesh (experts split across ep, sharded across efsdp), the
    layout no 2-rank test reaches; ep=ranks is covered on 2 ranks above."""
    steps = ("trainer.total_steps=2", "checkpoint.every_steps=0", "export.hf_at_end=false")
    runs = {ep: ep_train(tmp_path / f"ep{ep}", *steps, nproc=4, ep=ep) for ep in (1, 2)}
    assert_same_training(runs[1], runs[2])


@pytest.mark.slow
def test_checkpoint_saved_with_ep2_resumes_with_ep1(ep_train, tmp_path: Path) -> None:
    straight = ep_train(tmp_path / "straight", "trainer.total_steps=5", "checkpoint.every_steps=3",
                        "rollout.prompts_per_step=8", nproc=2, ep=2)
    ep_train(tmp_path / "resumed", "trainer.total_steps=3", "checkpoint.every_steps=3",
             "rollout.prompts_per_step=8", nproc=2, ep=2)
    resumed = ep_train(tmp_path / "resumed", "trainer.total_steps=5", "checkpoint.every_steps=3",
                       "rollout.prompts_per_step=8", nproc=2, ep=1)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5]
    assert_same_training(straight[3:], resumed[3:])
    final, after_resume = hf_weights(tmp_path / "straight" / "hf"), hf_weights(tmp_path / "resumed" / "hf")
    assert final.keys() == after_resume.keys()
    for name, tensor in final.items():
        torch.testing.assert_close(after_resume[name], tensor, rtol=1e-5, atol=1e-6, msg=name)


def test_ep_size_without_an_expert_parallel_family_is_a_config_error(run_graft) -> None:
    # no plugins: the core's families (qwen3_moe here) do not split experts
    result = run_graft(["train", "--nproc", "2", "engine.ep_size=2"], env={"GRAFT_PLUGINS": ""})
    assert result.returncode == 2
    assert ("engine.ep_size=2: the model family 'qwen3_moe' does not implement expert "
            "parallelism. Installed families that do: none." in result.stderr)
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_ep_size_must_divide_the_experts_and_the_ranks(run_graft, plugin_sites) -> None:
    site = plugin_sites["moe_ep"]
    result = run_graft(["train", "engine.ep_size=3", "--nproc", "3", "trainer.total_steps=1"],
                       site=site, timeout=300)
    assert result.returncode != 0 and "must divide the number of experts (8)" in result.stderr
    result = run_graft(["train", "engine.ep_size=2", "trainer.total_steps=1"], site=site)
    assert result.returncode == 2
    assert "engine.ep_size=2 must be a positive divisor of the world size 1" in result.stderr


def test_an_expert_parallel_forward_reads_the_weights_a_module_computes_with() -> None:
    from graft.engine import expert_weight

    class Experts(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.down_proj = torch.nn.Parameter(torch.ones(2, 3, 4))

    class Adapted(Experts):
        def expert_weight(self, name: str) -> torch.Tensor | None:
            return getattr(self, name) * 2  # what an adapter's merged weight is to its forward

    plain, adapted = Experts(), Adapted()
    assert expert_weight(plain, "down_proj") is plain.down_proj
    assert expert_weight(plain, "down_proj_bias") is None
    assert torch.equal(expert_weight(adapted, "down_proj"), 2 * adapted.down_proj)
