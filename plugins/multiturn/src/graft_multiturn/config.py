"""The ``features.multiturn`` config section (no torch: imported by every command)."""

from __future__ import annotations

from dataclasses import dataclass

from graft.config import bounded, choice


@dataclass
class MultiturnConfig:
    """``features.multiturn``: RL samples as multi-turn episodes with an environment plugin's
    tools (until graft-multiturn, the core's ``rollout.environment``, ``rollout.max_turns``,
    ``rollout.max_episode_tokens``, ``rollout.env_timeout_s`` and
    ``rollout.max_failed_env_steps``)."""

    # Multi-turn episodes with an environment plugin's tools (graft_environments; graft
    # plugins lists them), on any rollout engine; none = one response per prompt.
    environment: str = choice("none", ("none",), registry="environments")
    # With an environment: model turns per episode; tokens per episode after the prompt
    # (model and environment; each turn at most rollout.max_new_tokens); seconds per
    # environment call (past it the episode ends with reward 0, rollout/env_errors).
    max_turns: int = bounded(4, ge=1)
    max_episode_tokens: int = bounded(256, ge=1)
    env_timeout_s: float = bounded(10.0, gt=0.0)
    # With an environment: stop the run (exit 2) after this many training steps in a row whose
    # every episode ended in an environment error (each such step is a warning;
    # rollout/env_error_fraction is the share per step).
    max_failed_env_steps: int = bounded(3, ge=0, note="0: never stop")
    # An episode whose reset returns chat messages is built on the chat template: after each
    # observation the template's rendering of the whole conversation must start with the ids
    # so far. Where it does not (a thinking template that drops earlier <think> blocks;
    # multiturn/prefix_breaks per episode): keep = keep the history as the model saw it;
    # resegment = re-render it and go on from there, its tokens so far not trained.
    on_prefix_break: str = choice("keep", ("keep", "resegment"))
