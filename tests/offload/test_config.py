"""``features.offload``: defaults, and every bad value is a ConfigError naming the key."""

from __future__ import annotations

import sys

import pytest

import graft
from graft.errors import ConfigError
from graft.testing import check_config_section
from graft_offload.config import GIB, MIB, OffloadConfig


def test_defaults() -> None:
    assert check_config_section("offload", OffloadConfig) == {
        "enabled": False, "modules": [], "host_cache_limit_gb": 32.0, "min_tensor_mb": 1.0,
        "prefetch_blocks": 1, "timing": False}


def test_values_compose_and_convert_to_bytes() -> None:
    cfg = graft.compose(["features.offload.enabled=true", "features.offload.host_cache_limit_gb=1.5",
                         "features.offload.min_tensor_mb=0.5",
                         "features.offload.modules=['model.layers.{*}','model.extra.*']"])
    section = cfg.features.offload
    assert section.modules == ["model.layers.{*}", "model.extra.*"]
    assert section.host_cache_limit_bytes == int(1.5 * GIB)
    assert section.min_tensor_bytes == MIB // 2
    assert OffloadConfig(host_cache_limit_gb=0).host_cache_limit_bytes == 0


@pytest.mark.parametrize(("override", "message"), [
    ("host_cache_limit_gb=-1", r"'features.offload.host_cache_limit_gb' is -1.0: it must be in "
                               r"\[0, "),
    ("host_cache_limit_gb=inf", "'features.offload.host_cache_limit_gb' is inf"),
    ("host_cache_limit_gb=nan", "'features.offload.host_cache_limit_gb' is nan"),
    (f"host_cache_limit_gb={sys.maxsize // GIB + 1}", f"in \\[0, {sys.maxsize // GIB}\\]"),
    ("min_tensor_mb=-0.5", "'features.offload.min_tensor_mb' is -0.5: it must be in"),
    ("prefetch_blocks=0", "'features.offload.prefetch_blocks' is 0: it must be >= 1 "
                          r"\(1: bring back the next block down"),
    ("modules=[model..layers]", "empty segment"),
    ("modules=['model.{*}.mlp']", r"'\{\*\}' is allowed only as the last segment"),
    ("modules=['{*}']", r"'\{\*\}' is allowed only"),
    ("modules=['model.layers{*}']", r"'\{\*\}' is allowed only"),
    ("modules=['']", "give dotted module names"),
])
def test_bad_values_are_config_errors(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        graft.compose([f"features.offload.{override}"])


def test_a_wrong_type_names_the_key() -> None:
    with pytest.raises(ConfigError, match="prefetch_blocks"):
        graft.compose(["features.offload.prefetch_blocks=two"])
