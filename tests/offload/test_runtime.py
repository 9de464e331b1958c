"""Applying the offload from the config, and the step hooks over the process's offloaders."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import torch

import graft
from graft_offload import runtime
from graft_offload.patching import routed_offloader
from graft_offload.standin import DeferredCopyBackend


def compose(*overrides: str):
    return graft.compose(["model.preset=tiny-llama", "engine.activation_checkpointing=true",
                          "features.offload.enabled=true", *overrides])


def set_parameters(model: torch.nn.Module,
                   value: Callable[[str, torch.Tensor], torch.Tensor]) -> None:
    """Replace every parameter by ``value(name, parameter)``."""
    for prefix, module in model.named_modules():
        for name, param in list(module._parameters.items()):
            if param is not None:
                full = f"{prefix}.{name}" if prefix else name
                module._parameters[name] = torch.nn.Parameter(value(full, param.detach()))


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
                                     "offload/pinned_gb": 3 * per_block,
                                     "offload/offloaded_gb": 3 * per_block,
                                     "offload/offloaded_inputs": 3.0,
                                     "offload/other_saved_gb": 0.0,
                                     "offload/kept_on_gpu_blocks": 0.0,
                                     "offload/kept_on_gpu_gb": 0.0})
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


def test_a_model_on_the_meta_device_is_offloaded_once_it_runs(build_llama, train_llama,
                                                              identical) -> None:
    """As the core builds a ``model.path`` checkpoint: on meta when the hook runs, then given
    memory and filled; the offloader learns its device from the first block input."""
    expected = train_llama(build_llama(), steps=2)
    model = build_llama()
    weights = {name: p.detach().clone() for name, p in model.named_parameters()}
    set_parameters(model, lambda name, p: p.to("meta"))  # buffers stay real, as the core's
    backend = DeferredCopyBackend()
    with runtime.use_copy_backend(lambda: backend):
        offloader = runtime.offload_from_config(model, compose("features.offload.min_tensor_mb=0"),
                                                role="policy")
    try:
        assert not offloader.transfers.bound
        set_parameters(model, lambda name, p: weights[name])
        got = train_llama(model, steps=2, offloader=offloader, backend=backend)
        identical(expected, got)
        assert offloader.transfers.device == torch.device("cpu")
        assert all(m["offload/offloaded_gb"] > 0 for m in got.metrics)
    finally:
        runtime.remove_offload(list(model.model.layers), offloader)


def test_a_model_off_the_device_is_said_once_and_left_alone(build_llama,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    model = build_llama()  # on the CPU, and the copy backend is CUDA's
    offloader = runtime.offload_from_config(model, compose(), role="policy")
    try:
        ids = torch.arange(48).view(2, 24)
        with caplog.at_level(logging.WARNING, logger="graft.offload"):
            for _ in range(2):
                runtime.begin_step()
                model(input_ids=ids, labels=ids).loss.backward()
                metrics: dict[str, float] = {}
                runtime.end_step(metrics)
                assert metrics == {}
        assert caplog.text.count("activation offload does nothing in this run") == 1
        assert "runs on cpu, not on a CUDA device" in caplog.text
        assert offloader.pool.allocations == 0 and not offloader.transfers.bound
    finally:
        runtime.remove_offload(list(model.model.layers), offloader)
