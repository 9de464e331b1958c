"""How a batch of rewards runs: the `RewardExecutor` protocol (what a ``graft_reward_executor``
plugin returns), the core's own executor (`InlineRewards`: each reward in the calling thread, in
order, without a time limit), calling one reward (`run_reward`) and why one failed
(`RewardFailure`).

A sample whose reward raises, returns no finite number, or (in an executor's worker process)
ends its process is a `RewardFailure` in the batch's `RewardBatchResult` (it scores 0 there;
`graft.rl.rewards.RewardScorer` decides, by ``algorithm.reward_errors``, whether the run goes
on). Graft's own errors (a sample without a ground truth) stop the batch as they are.
"""

from __future__ import annotations

import math
import os
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from graft.errors import GraftError
from graft.plugins import call_with_keywords

if TYPE_CHECKING:
    from graft.config.schema import GraftConfig
    from graft.data.tasks import TextSample
    from graft.rl.rewards import RewardFunction


class RewardValueError(ValueError):
    """A reward returned something other than a finite number (the message says what)."""


def run_reward(fn: Callable[..., float], response: str, sample: Any, *,
               cfg: GraftConfig) -> float:
    """``fn`` called with the keywords it declares of ``response``, ``sample`` and ``cfg`` (the
    root config; in an executor's worker process its read-only copy), as a float; a value that
    is no finite number raises `RewardValueError`."""
    value = call_with_keywords(fn, response=response, sample=sample, cfg=cfg)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise RewardValueError(repr(value)[:200]) from None
    if not math.isfinite(number):
        raise RewardValueError(repr(number))
    return number


def reward_name(fn: Callable[..., Any]) -> str:
    """``module.qualname`` of a reward function, for messages."""
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def debug_trace(trace: str) -> str:
    """``trace`` (a formatted traceback) on a line of its own under ``GRAFT_DEBUG=1``, else
    nothing: what an error message about a reward appends."""
    return f"\n{trace.rstrip()}" if trace and os.environ.get("GRAFT_DEBUG") == "1" else ""


@dataclass(frozen=True)
class RewardFailure:
    """Why one sample's reward failed. ``kind``: ``value`` (it returned ``detail``, not a finite
    number), ``raised`` (``detail`` is the exception and where it was raised) or ``died`` (its
    worker process ended; ``detail`` says how); ``trace`` is the reward's traceback."""

    kind: str
    detail: str
    trace: str = ""

    @classmethod
    def from_exception(cls, exc: BaseException, trace: str) -> RewardFailure:
        """The failure of a reward that raised ``exc`` (`run_reward`'s `RewardValueError`: a
        ``value`` failure) with the formatted traceback ``trace``; a ``raised`` failure names
        the exception and the last frame of ``trace``."""
        if isinstance(exc, RewardValueError):
            return cls("value", str(exc), trace)
        where = [line.strip() for line in trace.splitlines() if line.strip().startswith("File ")]
        at = f" ({where[-1].removeprefix('File ')})" if where else ""
        return cls("raised", f"{type(exc).__name__}: {exc}{at}", trace)

    def describe(self, reward: str, origin: str) -> str:
        """One sentence naming ``reward`` and the sample (``origin``: its file and row)."""
        if self.kind == "value":
            return (f"the reward {reward} returned {self.detail} for {origin}; a reward returns "
                    f"a finite number")
        if self.kind == "died":
            return f"the reward {reward} ended its worker process on {origin} ({self.detail})"
        return f"the reward {reward} failed on {origin}: {self.detail}"


@dataclass
class RewardBatchResult:
    """The scores of one batch, in order (a failed sample's is 0.0), and the positions whose
    reward failed, with why."""

    scores: list[float]
    failures: dict[int, RewardFailure] = field(default_factory=dict)


@runtime_checkable
class RewardExecutor(Protocol):
    """Runs the rewards of an RL run's batches: what a ``graft_reward_executor`` plugin returns
    (graft-reward-pool's: threads or processes, each sample within a time limit), else the
    core's `InlineRewards`. A task is ``(reward, response, sample)``: a `RewardFunction`, the
    decoded response and the `graft.data.tasks.TextSample` it answers. An executor may honour
    what each reward declares: where it wants to run (`RewardFunction.pool`) and the modules to
    import before its first sample (`RewardFunction.preload`)."""

    def start(self, rewards: Sequence[RewardFunction]) -> None:
        """Get ready for ``rewards`` (those the run's samples use; maybe none): called once,
        when the scorer is built, before the model loads (start workers here)."""

    def score(self, tasks: Sequence[tuple[RewardFunction, str, TextSample]]) -> RewardBatchResult:
        """Every task's score, in order (`run_reward`); a failing reward is a `RewardFailure`
        of the result; a reward's `graft.errors.GraftError` is raised as it is."""

    def metrics(self) -> dict[str, float]:
        """This rank's counts of the last `score`, joined into the step's metrics ({} for
        none)."""

    def close(self) -> None:
        """Stop what `start` or `score` started (idempotent)."""


class InlineRewards:
    """The core's `RewardExecutor`: each reward called in the calling thread, one sample after
    another, in order, without a time limit (``pool`` and ``preload`` are not used: the reward's
    module is imported already). The rewards get the root config ``cfg``."""

    def __init__(self, *, cfg: GraftConfig) -> None:
        self.cfg = cfg

    def start(self, rewards: Sequence[RewardFunction]) -> None:
        """Nothing to start."""

    def score(self, tasks: Sequence[tuple[RewardFunction, str, TextSample]]) -> RewardBatchResult:
        """Every task's score, in order; see `RewardExecutor.score`."""
        result = RewardBatchResult([0.0] * len(tasks))
        for index, (reward, response, sample) in enumerate(tasks):
            try:
                result.scores[index] = run_reward(reward.fn, response, sample, cfg=self.cfg)
            except GraftError:
                raise
            except Exception as exc:  # noqa: BLE001 - the sample's failure, for the scorer
                result.failures[index] = RewardFailure.from_exception(exc,
                                                                      traceback.format_exc())
        return result

    def metrics(self) -> dict[str, float]:
        """No counts of its own."""
        return {}

    def close(self) -> None:
        """Nothing to stop."""
