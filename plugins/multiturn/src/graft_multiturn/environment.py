"""What a multi-turn environment is: the protocol environment plugins implement (the core's
``graft_environments`` registry, which graft-multiturn consumes).

An episode is one token sequence: the prompt (`Environment.reset`), then turns of model tokens
(kept exactly as the engine generated them) each answered by the environment's tokens
(`Environment.step`), until the environment says it is done or a limit ends it
(``features.multiturn.max_turns``, ``features.multiturn.max_episode_tokens``). Only model
tokens are trained on.

An observation is one of:

* token ids (``list[int]``): appended as they are (an environment that renders its own turns
  with the chat template's special tokens);
* text (``str``): tokenised on its own (``add_special_tokens=False``) and appended;
* chat messages (``list[dict]`` with ``role``/``content``): rendered on their own with the
  tokenizer's chat template, with the generation prompt (the next assistant turn's header);
* None from `Environment.reset`: the sample's prompt as the data loader encoded it.

Nothing already in the sequence is ever decoded and tokenised again, so a chat template that
is not append-only cannot change earlier tokens.

Both methods may be ``async def`` (the runner awaits them in a worker thread). Each call has
``features.multiturn.env_timeout_s`` seconds; an environment that raises, runs past that, or returns
something malformed ends its episode with reward 0 (counted in ``rollout/env_errors``), never
the run. An environment raises `MalformedAction` when the model's action cannot be carried out
(an unparseable tool call): the episode ends with reward 0, counted in
``rollout/malformed_actions``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

# token ids | text | chat messages (see the module docstring)
Observation = list[int] | str | list[dict[str, Any]]
# ``factory(*, cfg, tokenizer)`` (any subset) -> a fresh `Environment` for one episode
EnvironmentFactory = Callable[..., "Environment"]


class MalformedAction(Exception):
    """Raised by `Environment.step` when the model's action cannot be carried out (a tool call
    that does not parse): the episode ends with reward 0 and the message as its reason."""


@runtime_checkable
class Environment(Protocol):
    """One episode's environment; the factory builds a fresh one for every episode.

    Optional attribute ``stop``: strings that end a model turn (``("</calc>",)``): the turn's
    tokens are cut right after the first token at which the decoded turn contains one (a
    prefix of the sampled tokens, so their log-probs stay exact). Without it a turn ends at
    ``eos`` or after ``rollout.max_new_tokens`` tokens.
    """

    def reset(self, sample: Any) -> Observation | None:
        """Start the episode for ``sample`` (a `graft.data.tasks.TextSample`: ``prompt``,
        ``answer``, ``data_source``, ``extra_info``); return the prompt, or None for the
        sample's prompt as the data loader encoded it."""

    def step(self, action_ids: list[int], action_text: str
             ) -> tuple[Observation | None, float | None, bool]:
        """Answer one model turn (its token ids, and their text decoded without special
        tokens): ``(observation, reward, done)``.

        ``observation`` is appended after the turn (None or empty: nothing); ``reward`` is
        this turn's reward or None. ``done`` ends the episode. The episode's reward is the sum
        of the numbers returned plus, unless the step that returned ``done`` gave a number,
        the configured reward's (``algorithm.reward``) score of the episode's decoded response
        (model and environment tokens after the prompt): an environment that only runs tools
        leaves the final answer to the reward registry, also when a limit ends the episode.
        """
