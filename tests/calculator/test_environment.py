"""The calculator environment's turns and the final-answer reward."""

from __future__ import annotations

import pytest
from graft_calculator import CalculatorEnvironment, calculator_reward
from graft_calculator.reward import final_answer
from graft_multiturn import Environment, MalformedAction

from graft.data.tasks import TextSample


def test_a_call_is_answered_and_a_turn_without_one_is_the_answer() -> None:
    env = CalculatorEnvironment(call_reward=0.1)
    assert isinstance(env, Environment) and env.stop == ("</calc>",)
    assert env.reset(TextSample("12*7=", "", "84")) is None  # the sample's own prompt
    assert env.step([], "let me see <calc>12*7</calc>") == ("<result>84</result>", 0.1, False)
    assert env.step([], "<calc>84+0</calc>") == ("<result>84</result>", None, False)  # once
    assert env.step([], "so 84") == (None, None, True)


def test_calls_past_max_calls_end_the_episode() -> None:
    env = CalculatorEnvironment(max_calls=1)
    env.reset(None)
    assert env.step([], "<calc>1+1</calc>")[2] is False
    assert env.step([], "<calc>2+2</calc>") == (None, None, True)


def test_a_call_that_is_not_arithmetic_is_a_malformed_action() -> None:
    env = CalculatorEnvironment()
    env.reset(None)
    with pytest.raises(MalformedAction, match=r"<calc>open\('x'\)</calc>: Call is not"):
        env.step([], "<calc>open('x')</calc>")


@pytest.mark.parametrize("response, answer, reward", [
    ("<calc>12*7</calc><result>84</result>84", "84", 1.0),
    ("<calc>12*7</calc><result>84</result>", "84", 0.0),  # the tool's number is not an answer
    ("<calc>12*7</calc><result>84</result>it is 85", "84", 0.0),
    ("84", "84", 1.0), ("3.50", "3.5", 1.0), ("-48", "-48", 1.0), ("none", "1", 0.0)])
def test_the_final_answer_is_the_models_last_number_after_the_tool(response: str, answer: str,
                                                                   reward: float) -> None:
    assert calculator_reward(response, TextSample("", "", answer)) == reward
    assert final_answer("a 1 b 2") == "2"
