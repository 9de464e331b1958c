"""Calling environments safely: each call in a daemon thread with a deadline, its output checked.

A call that raises, runs past its deadline or returns something malformed gives an `EnvFailure`
instead of a value; the caller ends that episode. A thread past its deadline is abandoned (a
daemon: it cannot keep the process alive), as nothing can stop a Python thread from outside.
A failure keeps the traceback of what raised, or where a call past its deadline was stuck
(shown under ``GRAFT_DEBUG=1``).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from graft_multiturn.environment import MalformedAction


@dataclass(frozen=True)
class EnvFailure:
    """Why an environment call gave no value: ``kind`` is ``error`` (raised, timed out or
    returned something malformed) or ``malformed_action`` (`MalformedAction`); ``detail`` is
    the traceback of what raised, or the stack where a call past its deadline was (else "")."""

    kind: str
    reason: str
    detail: str = ""


class EnvCall:
    """One environment call running in its own daemon thread (started at construction)."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self.box: dict[str, Any] = {}
        self.started = time.perf_counter()
        self.thread = threading.Thread(target=self._run, args=(fn, args), daemon=True,
                                       name="graft-environment")
        self.thread.start()

    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            value = fn(*args)
            if inspect.isawaitable(value):  # an async environment: its own event loop per call
                value = asyncio.run(_awaited(value))
            self.box["value"] = value
        except MalformedAction as exc:
            self.box["failure"] = EnvFailure("malformed_action", f"malformed action: {exc}",
                                             traceback.format_exc())
        except Exception as exc:  # an environment's bug ends its episode, never the run
            self.box["failure"] = EnvFailure("error", f"raised {type(exc).__name__}: {exc}",
                                             traceback.format_exc())

    def result(self, timeout_s: float) -> Any:
        """The call's value, or an `EnvFailure`; waits until ``timeout_s`` after the start."""
        self.thread.join(max(0.0, self.started + timeout_s - time.perf_counter()))
        if self.thread.is_alive():
            frame = sys._current_frames().get(self.thread.ident)
            where = "".join(traceback.format_stack(frame)) if frame is not None else ""
            return EnvFailure("error", f"took longer than features.multiturn.env_timeout_s={timeout_s:g}",
                              f"the call was here when its time ran out:\n{where}")
        return self.box.get("failure", self.box.get("value"))


async def _awaited(value: Any) -> Any:
    return await value


def call_all(calls: Sequence[tuple[Callable[..., Any], tuple[Any, ...]]],
             timeout_s: float) -> list[Any]:
    """Run every ``(fn, args)`` at once, each within ``timeout_s``; values or `EnvFailure`."""
    running = [EnvCall(fn, *args) for fn, args in calls]
    return [call.result(timeout_s) for call in running]


def checked_step(value: Any) -> tuple[Any, float | None, bool] | EnvFailure:
    """``(observation, reward, done)`` from what ``step`` returned, or an `EnvFailure` saying
    what is malformed about it."""
    if isinstance(value, EnvFailure):
        return value
    if not isinstance(value, tuple | list) or len(value) != 3:
        return EnvFailure("error", f"step returned {_short(value)}, not (observation, reward, "
                                   f"done)")
    observation, reward, done = value
    if reward is not None and (not isinstance(reward, numbers.Real) or isinstance(reward, bool)
                               or not math.isfinite(float(reward))):
        return EnvFailure("error", f"step returned the reward {_short(reward)}, not a finite "
                                   f"number or None")
    if not isinstance(done, bool | int):
        return EnvFailure("error", f"step returned done={_short(done)}, not a bool")
    return observation, None if reward is None else float(reward), bool(done)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
