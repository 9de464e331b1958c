"""``features.exact.enabled`` refuses, with a config error that says why, what its kernels
cannot serve, and turns the fused decode kernels off where the user left them."""

from __future__ import annotations

import pytest
import torch
from graft_exact import ExactKernelError, exact_kernels

from graft.config import compose
from graft.errors import ConfigError


@pytest.mark.parametrize(("overrides", "message"), [
    (["rollout.engine=vllm"], "rollout.engine=embedded"),
    (["rollout.decode=static", "rollout.decode_compile=inductor"], "decode_compile=inductor"),
    (["engine.compile=true"], "engine.compile=true"),
    (["features.graphed_decode.fuse_kernels=true"], "graphed_decode.fuse_kernels=true"),
    (["model.preset=tiny-deepseek-v4"], "indexer"),
])
def test_what_the_exact_kernels_cannot_serve_is_a_config_error(overrides: list[str],
                                                               message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        compose(["features.exact.enabled=true", *overrides])


def test_exact_is_off_by_default_and_composes_for_the_core_presets() -> None:
    assert compose([]).features.exact.enabled is False
    for preset in ("tiny-llama", "tiny-qwen3-moe", "tiny-deepseek-v3", "tiny-gpt-oss"):
        assert compose(["features.exact.enabled=true", f"model.preset={preset}"]).features.exact.enabled
    windowed = ["model.preset=tiny-qwen3-moe", "+model.overrides.use_sliding_window=true",
                "+model.overrides.sliding_window=16"]  # shorter than the default run's sequences
    assert compose(["features.exact.enabled=true", *windowed]).features.exact.enabled


def test_the_fused_decode_kernels_are_off_unless_the_user_asked() -> None:
    """graft-graphed-decode's fused decode step (``features.graphed_decode.fuse_kernels``)."""
    assert compose([]).features.graphed_decode.fuse_kernels is True
    cfg = compose(["features.exact.enabled=true"])
    assert cfg.features.graphed_decode.fuse_kernels is False
    assert compose(["features.exact.enabled=true", "features.graphed_decode.fuse_kernels=false"]
                   ).features.graphed_decode.fuse_kernels is False


def test_an_operator_without_an_exact_kernel_is_refused_inside_the_mode() -> None:
    q = torch.randn(1, 2, 4, 8)
    with exact_kernels(), pytest.raises(ExactKernelError, match="scaled_dot_product"):
        torch.nn.functional.scaled_dot_product_attention(q, q, q)
    torch.nn.functional.scaled_dot_product_attention(q, q, q)  # outside: as before
