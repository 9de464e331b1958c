"""graft-calculator as installed: graft.testing's conformance check, its section, its
environment selectable by name, its reward picked by data_source."""

from __future__ import annotations

import pytest
from graft_calculator import DATA_SOURCE, CalculatorConfig, CalculatorEnvironment, calculator_reward
from graft_multiturn import environments

from graft.config import compose
from graft.data.tasks import TextSample
from graft.errors import ConfigError
from graft.rl.rewards import RewardChooser
from graft.testing import check_config_section, check_installed_plugin


def test_the_installed_plugin_passes_graft_testing() -> None:
    assert check_installed_plugin("calculator") == [
        "graft_config_sections", "graft_environments", "graft_reward_functions"]
    assert check_config_section("calculator", CalculatorConfig) == {
        "max_calls": 3, "call_reward": 0.0, "format": "auto"}


def test_the_environment_is_selectable_and_takes_its_section() -> None:
    cfg = compose(["features.multiturn.environment=calculator", "features.calculator.max_calls=1",
                   "features.calculator.call_reward=0.2", "features.calculator.format=calc"])
    env = environments()["calculator"](cfg=cfg)
    assert isinstance(env, CalculatorEnvironment) and (env.max_calls, env.call_reward) == (1, 0.2)
    # auto (the default): <calc> for a tokenizer without a chat template, as before
    default = compose(["features.multiturn.environment=calculator"])
    assert isinstance(environments()["calculator"](cfg=default, tokenizer=object()),
                      CalculatorEnvironment)
    hermes = compose(["features.multiturn.environment=calculator",
                      "features.calculator.max_calls=1", "features.calculator.format=hermes"])
    with pytest.raises(ValueError, match=r"format=hermes needs a tokenizer with a chat template"):
        environments()["calculator"](cfg=hermes, tokenizer=object())
    with pytest.raises(ConfigError, match=r"features.multiturn.environment.*calculator"):
        compose(["features.multiturn.environment=calculater"])
    with pytest.raises(ConfigError, match=r"features.calculator.max_calls"):
        compose(["features.calculator.max_calls=-1"])


def test_auto_scores_the_problems_with_the_calculator_reward() -> None:
    reward = RewardChooser("auto", "file")(TextSample("2+3=", "", "5", data_source=DATA_SOURCE))
    assert reward.fn is calculator_reward
