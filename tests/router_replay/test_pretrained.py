"""Routing replay on the path real users take: a model loaded from a local Hugging Face directory
(``model.path``: built on the meta device, sharded, then filled), on one rank and on two gloo
ranks, and with experts split over two ranks (GPT-OSS, ``engine.ep_size=2``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from graft.testing.checkpoint import save_tiny_checkpoint

EP_SCRIPT = Path(__file__).resolve().parent / "scripts" / "ep_replay.py"
# Two micro-batches per rank on two ranks, so mini_batches=2 updates twice: R2 replays too.
RL = ("rollout.prompts_per_step=2", "rollout.n=4", "rollout.max_new_tokens=6",
      "algorithm.mini_batches=2", "engine.max_tokens_per_micro_batch=48")
METRICS = ("router_replay/mismatch_fraction", "router_replay/fallback_rows",
           "router_replay/bytes_per_token")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen3-MoE preset saved as a Hugging Face directory (weights and tokenizer)."""
    return save_tiny_checkpoint("tiny-qwen3-moe", tmp_path_factory.mktemp("hf") / "tiny-qwen3-moe", seed=3)


def assert_replayed_every_step(rows: list[dict], mode: str) -> None:
    """Three steps, each with the plugin's metrics from a step that replayed."""
    assert [row["step"] for row in rows] == [1, 2, 3]
    for row in rows:
        assert set(METRICS) <= set(row)
        assert row["router_replay/bytes_per_token"] == 2 * 2 * 2 + 1  # 2 layers, top-2, flag
        # R3: the last token of every sample has no route; R2 recorded every token
        assert (row["router_replay/fallback_rows"] > 0) == (mode == "R3")


@pytest.mark.parametrize("mode", ["R2", "R3"])
def test_replay_on_a_model_loaded_from_a_local_checkpoint(fit, hf_dir: Path, tmp_path: Path,
                                                          mode: str) -> None:
    rows = fit(tmp_path, f"model.path={hf_dir}", *RL, f"features.router_replay.mode={mode}",
               steps=3)
    assert_replayed_every_step(rows, mode)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["R2", "R3"])
def test_replay_on_a_local_checkpoint_on_two_gloo_ranks(graft_train, metrics_of, hf_dir: Path,
                                                        tmp_path: Path, mode: str) -> None:
    graft_train(tmp_path, f"model.path={hf_dir}", *RL, f"features.router_replay.mode={mode}",
                "trainer.total_steps=3", "engine.device=cpu", "checkpoint.every_steps=0",
                "checkpoint.save_at_end=false", "export.hf_at_end=false", nproc=2)
    assert_replayed_every_step(metrics_of(tmp_path), mode)


@pytest.mark.slow
def test_r2_with_experts_split_over_two_ranks_replays_the_recorded_experts(
        tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             "--nproc-per-node=2", str(EP_SCRIPT), str(tmp_path)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    assert ranks[0]["recorded"].shape[0] != ranks[1]["recorded"].shape[0]  # each rank's own tokens
    for rank in ranks:
        real, recorded = rank["real"], rank["recorded"]
        assert torch.equal(rank["stored"].long()[real], recorded[real])
        # the routers moved: natively they now choose other experts for most tokens ...
        assert (rank["native"][real] != recorded[real]).any(-1).float().mean() > 0.5
        # ... and the replayed update hands the experts exactly the recorded ones
        assert torch.equal(rank["replayed"][real], recorded[real])
        assert torch.equal(rank["replayed"][~real], rank["native"][~real])  # pad: native
        assert rank["metrics"]["router_replay/mismatch_fraction"] > 0.1
        assert rank["metrics"]["router_replay/bytes_per_token"] == 9.0
    assert ranks[0]["metrics"] == ranks[1]["metrics"]  # summed over the ranks


def test_exact_logits_on_a_local_checkpoint_route_as_the_rollout_did(fit, hf_dir: Path,
                                                                     tmp_path: Path) -> None:
    """graft-exact (features.exact.enabled) with R3 on a model loaded from its directory (two
    features together on the meta-build, shard and fill path): the rollout's log-probs are the
    trainer's bit for bit on every step (without exact they differ by 5e-8 to 1.5e-7 here), and
    the trainer's routers choose what the rollout recorded (one on-policy pass; on CPU that
    holds without exact too, the differences being far below a routing tie)."""
    rows = fit(tmp_path, f"model.path={hf_dir}", *RL[:3], "engine.max_tokens_per_micro_batch=48",
               "features.router_replay.mode=R3", "features.exact.enabled=true",
               "rollout.decode=dynamic", steps=3)
    assert [row["step"] for row in rows] == [1, 2, 3]
    for row in rows:
        assert (row["train_infer_logprob_diff"], row["train_infer_logprob_exact_fraction"]) \
            == (0.0, 1.0)
        assert row["router_replay/mismatch_fraction"] == 0.0
        assert row["router_replay/fallback_rows"] > 0  # R3 replayed (the last tokens natively)
