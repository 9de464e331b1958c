"""``features.deepseek_v4``: defaults, and bad values rejected with the fix in the message."""

from __future__ import annotations

import pytest

import graft
import graft_deepseek_v4.plugin as plugin
from graft.errors import ConfigError
from graft.testing import check_plugin


def test_the_plugin_matches_the_specs_and_qat_is_off_by_default() -> None:
    check_plugin(plugin)
    cfg = graft.compose(["model.preset=tiny-deepseek-v4"])
    section = cfg.features.deepseek_v4
    assert (section.qat, section.qat_kernel, section.expert_dtype) == ("none", "auto", "auto")


def test_an_unknown_qat_mode_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match=r"features.deepseek_v4.qat' is 'fp8'.*Valid values: "
                                          r"none, fp8_blockwise, fp8_blockwise_gemm"):
        graft.compose(["features.deepseek_v4.qat=fp8"])


def test_gspo_is_not_this_plugin_s() -> None:
    """GSPO, once this plugin's, is graft-gspo's: its settings are under ``features.gspo``."""
    assert not hasattr(graft.compose([]).features.deepseek_v4, "gspo_rollout_is")
    with pytest.raises(ConfigError, match="gspo_rollout_is"):
        graft.compose(["features.deepseek_v4.gspo_rollout_is=token"])


def test_qat_on_another_model_family_is_a_config_error() -> None:
    cfg = graft.compose(["model.preset=tiny-llama", "features.deepseek_v4.qat=fp8_blockwise"])
    model, _ = graft.build_model(cfg.model)
    with pytest.raises(ConfigError, match="quantises DeepSeek-V4 models; this model is 'llama'"):
        plugin.graft_pre_shard(model=model, cfg=cfg, mesh=None, role="policy")
