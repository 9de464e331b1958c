"""Applying the offload from the config, and the step hooks over the process's offloaders."""

from __future__ import annotations

import logging

import pytest
import torch

import graft
from graft_offload import runtime
from graft_offload.patching import routed_offloader
from graft_offload.standin import DeferredCopyBackend


def compose(*overrides: str):
    return graft.compose(["model.preset=tiny-llama", "engine.activation_checkpointing=true",
                          "features.offload.enabled=true", *overrides])


def test_the_step_hooks_report_only_offloaders_whose_model_trained(build_llama, offload) -> None:
    trained, idle = build_llama(), build_llama()
    offload(trained.model.layers, DeferredCopyBackend())
    offload(idle.model.layers, DeferredCopyBackend())
    metrics: dict[str, float] = {}
    runtime.begin_step()
    ids = torch.arange(48).view(2, 24)
    trained(input_ids=ids, labels=ids).loss.backward()
    runtime.end_step(metrics)
    per_block = 2 * 24 * 64 * 4 / 2**30
    assert metrics == pytest.approx({"offload/host_gb": 3 * per_block,
                                     "offload/offloaded_gb": 3 * per_block,
                                     "offload/kept_on_gpu_blocks": 0.0})
    runtime.begin_step()
    metrics = {}
    runtime.end_step(metrics)
    assert metrics == {}


def test_the_reference_model_and_a_disabled_section_are_left_alone(build_llama) -> None:
    model = build_llama()
    with runtime.use_copy_backend(DeferredCopyBackend):
        assert runtime.offload_from_config(model, compose(), role="reference") is None
        assert runtime.offload_from_config(
            model, compose("features.offload.enabled=false"), role="policy") is None
    assert all(routed_offloader(layer) is None for layer in model.model.layers)


def test_the_configured_modules_are_offloaded(build_llama) -> None:
    model = build_llama()
    cfg = compose("features.offload.modules=['model.layers.1','model.layers.3']",
                  "features.offload.prefetch_blocks=2", "features.offload.min_tensor_mb=0.5")
    with runtime.use_copy_backend(DeferredCopyBackend):
        offloader = runtime.offload_from_config(model, cfg, role="policy")
    try:
        assert offloader.names == ["model.layers.1", "model.layers.3"]
        assert (offloader.prefetch_blocks, offloader.min_bytes) == (2, 2**19)
        assert [routed_offloader(layer) for layer in model.model.layers] == [
            None, offloader, None, offloader]
    finally:
        runtime.remove_offload([model.model.layers[1], model.model.layers[3]], offloader)


def test_a_model_off_the_device_is_said_once_and_left_alone(build_llama, monkeypatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(runtime, "_said_no_device", False)
    model = build_llama()
    with caplog.at_level(logging.WARNING, logger="graft.offload"):
        for _ in range(2):
            assert runtime.offload_from_config(model, compose(), role="policy") is None
    assert caplog.text.count("activation offload does nothing in this run") == 1
    assert "not on a CUDA device" in caplog.text
