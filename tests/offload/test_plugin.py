"""The installed plugin through Graft: hooks, a whole RL run with offload on the CPU stand-in,
and the command line on a machine without a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import graft
from graft import hookimpl
from graft.engine.distributed.env import shutdown_distributed
from graft.errors import ConfigError
from graft.testing import check_installed_plugin
from graft_offload.patching import routed_offloader
from graft_offload.runtime import use_copy_backend
from graft_offload.standin import DeferredCopyBackend

RL_RUN = ["trainer.total_steps=3", "engine.activation_checkpointing=true", "loss.kl_coef=0.1",
          "algorithm.ppo_epochs=2", "rollout.prompts_per_step=4", "rollout.n=4",
          "checkpoint.save_at_end=false", "export.hf_at_end=false",
          "+model.overrides.num_hidden_layers=3", "features.offload.min_tensor_mb=0"]
COMPARED = ("loss", "grad_norm", "reward_mean", "kl", "entropy", "train_infer_logprob_diff")


class RecordModels:
    """Keeps every model ``graft_pre_shard`` sees, by role."""

    def __init__(self) -> None:
        self.models: dict[str, torch.nn.Module] = {}

    @hookimpl
    def graft_pre_shard(self, model: torch.nn.Module, role: str) -> None:
        self.models[role] = model


def rl_run(tmp_path: Path, name: str, *overrides: str) -> list[dict]:
    cfg = graft.compose([*RL_RUN, f"trainer.run_dir={tmp_path / name}", *overrides])
    trainer = None
    with use_copy_backend(DeferredCopyBackend):
        try:
            trainer = graft.Trainer(cfg)
            return trainer.fit()
        finally:
            del trainer  # FSDP2 state holds the process group until the model is gone
            shutdown_distributed()


def test_the_installed_plugin_passes_graft_testing() -> None:
    assert set(check_installed_plugin("offload")) == {
        "graft_config_sections", "graft_pre_shard", "graft_step_begin", "graft_step_end"}


@pytest.mark.slow
def test_an_rl_run_is_bit_identical_with_offload_and_reports_it(tmp_path: Path,
                                                                graft_plugin) -> None:
    """The MoE preset, FSDP2 (one rank), checkpointing, a KL reference, two update passes per
    step and no-grad passes (rollout, old and reference log-probs) in between."""
    expected = rl_run(tmp_path, "plain")
    recorder = RecordModels()
    graft_plugin(recorder, name="record-models")
    got = rl_run(tmp_path, "offload", "features.offload.enabled=true")
    for want, have in zip(expected, got, strict=True):
        assert {k: have.get(k) for k in COMPARED} == {k: want.get(k) for k in COMPARED}
        assert have["offload/offloaded_gb"] > 0 and have["offload/host_gb"] > 0
        assert have["offload/kept_on_gpu_blocks"] == 0
    policy, reference = recorder.models.pop("policy"), recorder.models.pop("reference")
    assert all(routed_offloader(block) is not None for block in policy.model.layers)
    assert all(routed_offloader(block) is None for block in reference.model.layers)


def test_offload_without_activation_checkpointing_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs engine.activation_checkpointing=true"):
        rl_run(tmp_path, "no-ac", "features.offload.enabled=true",
               "engine.activation_checkpointing=false")


@pytest.mark.slow
def test_without_a_gpu_it_says_so_once_and_the_run_goes_on(run_graft, tmp_path: Path) -> None:
    result = run_graft(["train", f"trainer.run_dir={tmp_path}", "trainer.mode=sft",
                        "trainer.total_steps=2", "model.preset=tiny-llama",
                        "engine.activation_checkpointing=true",
                        "features.offload.enabled=true", "export.hf_at_end=false"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count("activation offload does nothing in this run") == 1
    assert "offload/host_gb" not in (tmp_path / "metrics.jsonl").read_text()


@pytest.mark.slow
def test_a_pattern_matching_nothing_exits_2_naming_it(run_graft, tmp_path: Path) -> None:
    result = run_graft(["train", f"trainer.run_dir={tmp_path}", "trainer.total_steps=1",
                        "features.offload.enabled=true",
                        "features.offload.modules=['model.layer.{*}']"])
    assert result.returncode == 2
    assert "the pattern 'model.layer.{*}' matches no module" in result.stderr
    assert "Nearest module names: model.layers" in result.stderr
    assert "Traceback" not in result.stderr
