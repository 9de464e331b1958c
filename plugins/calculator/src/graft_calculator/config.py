"""``features.calculator``: the tool-call format and how many calls an episode may make."""

from __future__ import annotations

from dataclasses import dataclass

from graft.config import bounded, choice


@dataclass
class CalculatorConfig:
    """The calculator environment's settings (``features.calculator``)."""

    # Tool calls one episode may make; a turn with another call past them ends the episode
    # (the final answer is then scored as it stands). features.multiturn.max_turns bounds the
    # turns.
    max_calls: int = bounded(3, ge=0)
    # Added to the episode's reward for its first call that evaluates (0: only the final
    # answer counts). Shaping for models that have never seen the tool; below the answer's 1.
    call_reward: float = bounded(0.0, ge=0.0)
    # How the model calls the tool: auto (the default) = the chat template's own format when
    # the tokenizer has one (graft_multiturn.tools: Hermes/Qwen <tool_call>{json}</tool_call>,
    # harmony, Llama-3 JSON; the prompt as chat messages, the tool list through the template's
    # tools, results as tool messages), else calc; hermes, harmony, llama3 = that format (needs
    # a chat template); calc = <calc>expr</calc> answered by <result>value</result> in the raw
    # token sequence (any tokenizer).
    format: str = choice("auto", ("auto", "hermes", "harmony", "llama3", "calc"))
