"""Offload on the path real users take: a model loaded from a local Hugging Face directory
(``model.path``: built on the meta device, sharded, then filled from rank 0's read), on one rank
and on two gloo ranks, with the CPU stand-in for the device. The offload must run there (its
metrics every step) and change nothing (the same losses and gradient norms as without it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from graft import hookimpl
from graft.config import ModelConfig, compose
from graft.data.tokenizer import load_tokenizer
from graft.engine.distributed.env import shutdown_distributed
from graft.models import build_model
from graft.training.trainer import Trainer
from graft_offload.patching import routed_offloader
from graft_offload.runtime import use_copy_backend
from graft_offload.standin import DeferredCopyBackend

SCRIPT = Path(__file__).resolve().parent / "scripts" / "model_path_runs.py"
RUN = ["trainer.mode=sft", "trainer.total_steps=3", "engine.activation_checkpointing=true",
       "features.offload.min_tensor_mb=0", "checkpoint.every_steps=0",
       "checkpoint.save_at_end=false", "export.hf_at_end=false"]
COMPARED = ("loss", "grad_norm")
LAYERS = 3


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama preset (3 layers) saved as a Hugging Face directory with its tokenizer."""
    folder = tmp_path_factory.mktemp("hf") / "tiny-llama"
    model, _ = build_model(ModelConfig(preset="tiny-llama",
                                       overrides={"num_hidden_layers": LAYERS}), seed=3)
    model.save_pretrained(folder)
    load_tokenizer(None, None).save_pretrained(folder)
    return folder


class PreShardDevices:
    """Where the policy model's parameters are when ``graft_pre_shard`` sees it."""

    def __init__(self) -> None:
        self.meta: bool | None = None
        self.policy: torch.nn.Module | None = None

    @hookimpl
    def graft_pre_shard(self, model: torch.nn.Module, role: str) -> None:
        if role == "policy":
            self.meta = all(p.is_meta for p in model.parameters())
            self.policy = model


def fit(*overrides: str) -> list[dict]:
    trainer = None
    with use_copy_backend(DeferredCopyBackend):
        try:
            trainer = Trainer(compose([*RUN, *overrides]))
            return trainer.fit()
        finally:
            del trainer  # FSDP2 state holds the process group until the model is gone
            shutdown_distributed()


def assert_offloaded_and_identical(plain: list[dict], offload: list[dict]) -> None:
    """Three steps, each with the offload's metrics, losses and gradient norms bit-identical."""
    assert [row["step"] for row in offload] == [1, 2, 3]
    for want, have in zip(plain, offload, strict=True):
        assert {k: have[k] for k in COMPARED} == {k: want[k] for k in COMPARED}
        assert "offload/offloaded_gb" not in want
        assert have["offload/offloaded_gb"] > 0 and have["offload/host_gb"] > 0
        assert have["offload/kept_on_gpu_blocks"] == 0


def test_offload_runs_on_a_model_loaded_from_a_local_checkpoint(hf_dir: Path, tmp_path: Path,
                                                                graft_plugin) -> None:
    plain = fit(f"model.path={hf_dir}", f"trainer.run_dir={tmp_path / 'plain'}")
    seen = PreShardDevices()
    graft_plugin(seen, name="pre-shard-devices")
    offload = fit(f"model.path={hf_dir}", f"trainer.run_dir={tmp_path / 'offload'}",
                  "features.offload.enabled=true")
    assert seen.meta is True  # the path under test: the hook saw the model on meta
    assert all(routed_offloader(block) is not None for block in seen.policy.model.layers)
    assert_offloaded_and_identical(plain, offload)


@pytest.mark.slow
def test_offload_runs_on_a_local_checkpoint_on_two_gloo_ranks(hf_dir: Path,
                                                              tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             "--nproc-per-node=2", str(SCRIPT), str(hf_dir), str(tmp_path)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    for rank in (0, 1):
        rows = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert_offloaded_and_identical(rows["plain"], rows["offload"])
