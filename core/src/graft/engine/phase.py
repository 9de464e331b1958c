"""Which pass a packed forward belongs to (the ``phase`` of ``graft_prepare_inputs``,
``graft_post_forward`` and ``graft_compute``), and the steps ``graft_compute`` wraps.

An RL step runs, over the same micro-batches, the policy's old-log-prob pass, the reference's
pass (KL penalty), then the update passes; a plugin that records in one pass and replays in the
next (routing replay: R2 records in ``old_logprobs``) tells them apart by this name.
`compute` runs one step of the model's computation (a forward, a backward, a decode step)
inside every plugin's ``graft_compute`` wrapper.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, TypeVar

if TYPE_CHECKING:
    from graft.config.schema import GraftConfig

Phase = Literal["rollout_logprobs", "old_logprobs", "ref_logprobs", "update", "sft"]

ROLLOUT_LOGPROBS: Phase = "rollout_logprobs"  # the trainer scores samples the engine gave no log-probs
OLD_LOGPROBS: Phase = "old_logprobs"  # the policy before the update (no grad)
REF_LOGPROBS: Phase = "ref_logprobs"  # the frozen KL reference (no grad)
UPDATE: Phase = "update"  # RL forward + backward
SFT: Phase = "sft"  # supervised forward + backward

PHASES: tuple[Phase, ...] = (ROLLOUT_LOGPROBS, OLD_LOGPROBS, REF_LOGPROBS, UPDATE, SFT)

# ``graft_compute``'s ``step``: the trainer's (``phase`` one of `PHASES`) and the rollout's
# (``phase`` `ROLLOUT`)
FORWARD, GRADIENT, BACKWARD = "forward", "gradient", "backward"
GENERATE, PREFILL, DECODE, SAMPLE_LOGPROBS = "generate", "prefill", "decode", "sample_logprobs"
STEPS = (FORWARD, GRADIENT, BACKWARD, GENERATE, PREFILL, DECODE, SAMPLE_LOGPROBS)
ROLLOUT = "rollout"

T = TypeVar("T")


def compute(step: str, run: Callable[[], T], *, phase: str, model: Any,
            cfg: GraftConfig | None) -> T:
    """``run()`` (one ``step`` of `STEPS` of ``model``'s computation in ``phase``) inside every
    plugin's ``graft_compute`` wrapper, which gets the root config ``cfg``; its result. Without
    a wrapper, ``run()`` alone."""
    from graft.plugins import get_plugin_manager

    caller = get_plugin_manager().hook.graft_compute
    if not caller.get_hookimpls():
        return run()
    # the step is the one plain implementation, called with no argument (pluggy's call_extra)
    return caller.call_extra([lambda: run()], {"step": step, "phase": phase, "model": model,
                                               "cfg": cfg})
