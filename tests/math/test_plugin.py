"""graft-math as installed: it passes graft.testing's conformance check, its section composes,
and algorithm.reward=auto scores verl's math data_sources with it."""

from __future__ import annotations

import pytest

from graft.config import compose
from graft.data.tasks import TextSample
from graft.errors import ConfigError
from graft.rl.rewards import RewardChooser
from graft.testing import check_config_section, check_installed_plugin
from graft_math import DATA_SOURCES, MathConfig
from graft_math.reward import math_reward


def test_the_installed_plugin_passes_graft_testing() -> None:
    assert check_installed_plugin("math") == ["graft_config_sections", "graft_reward_functions"]
    assert check_config_section("math", MathConfig) == {"extract": "strict", "parse_timeout_s": 5}


def test_the_reward_is_selectable_by_name() -> None:
    assert compose(["algorithm.reward=math"]).algorithm.reward == "math"
    with pytest.raises(ConfigError, match=r"features.math.extract"):
        compose(["features.math.extract=last"])
    with pytest.raises(ConfigError, match=r"features.math.parse_timeout_s"):
        compose(["features.math.parse_timeout_s=0"])


@pytest.mark.parametrize("source", ["openai/gsm8k", "lighteval/MATH",
                                    "DigitalLearningGmbH/MATH-lighteval"])
def test_auto_scores_verls_math_sources_with_it(source: str) -> None:
    assert source in DATA_SOURCES
    reward = RewardChooser("auto", "file")(TextSample("q", "", "1", data_source=source))
    assert reward.fn is math_reward and reward.pool == "process"
    other = RewardChooser("auto", "file")(TextSample("q", "", "1", data_source="my/own"))
    assert other.fn is not math_reward
