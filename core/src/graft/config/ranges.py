"""Numeric settings with an allowed range, checked after composition.

A field declared with `bounded` carries its range as data, so the check, the error message and
the schema test (every numeric setting has a range) read one source. A value outside the range
is a `ConfigError` (exit 2) naming the key and the range, instead of a traceback or a run that
silently does nothing (``trainer.total_steps=-5``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from graft.errors import ConfigError

RANGE_KEY = "range"


@dataclass(frozen=True)
class Range:
    """An interval of allowed values; a bound of None is open-ended. Values must be finite."""

    low: float | None = None
    high: float | None = None
    low_inclusive: bool = True
    high_inclusive: bool = True
    # What the bounds mean, said after the range in the error ("0 disables clipping").
    note: str = ""

    def contains(self, value: float) -> bool:
        """True when ``value`` is a finite number inside the interval."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        if self.low is not None and (value < self.low or (value == self.low and not self.low_inclusive)):
            return False
        return not (self.high is not None
                    and (value > self.high or (value == self.high and not self.high_inclusive)))

    def describe(self) -> str:
        """The range as users read it: ``>= 1``, ``> 0``, ``in [0, 1)``."""
        low_op = ">=" if self.low_inclusive else ">"
        high_op = "<=" if self.high_inclusive else "<"
        if self.low is None and self.high is None:
            return "a finite number"
        if self.high is None:
            return f"{low_op} {_number(self.low)}"
        if self.low is None:
            return f"{high_op} {_number(self.high)}"
        left = "[" if self.low_inclusive else "("
        right = "]" if self.high_inclusive else ")"
        return f"in {left}{_number(self.low)}, {_number(self.high)}{right}"

    def outside_example(self) -> float:
        """A finite value just outside the range (for tests that walk the schema)."""
        if self.low is not None:
            return self.low - 1 if self.low_inclusive else self.low
        if self.high is not None:
            return self.high + 1 if self.high_inclusive else self.high
        return math.nan


def _number(value: float | None) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def bounded(default: Any = dataclasses.MISSING, *, ge: float | None = None,
            gt: float | None = None, le: float | None = None, lt: float | None = None,
            default_factory: Callable[[], Any] | Any = dataclasses.MISSING,
            note: str = "") -> Any:
    """A numeric field (int, float, optional, or a list of numbers checked element by element)
    whose value must lie in the range the bounds give: ``ge``/``gt`` below, ``le``/``lt`` above.

    ``note`` says what the bounds mean (``"0 disables clipping"``); it ends the error message.
    ``None`` is allowed for an optional field (it means "off" or "derived").
    """
    if ge is not None and gt is not None or le is not None and lt is not None:
        raise ValueError("bounded: give at most one lower bound (ge or gt) and one upper (le or lt)")
    allowed = Range(low=ge if ge is not None else gt, high=le if le is not None else lt,
                    low_inclusive=gt is None, high_inclusive=lt is None, note=note)
    metadata = {RANGE_KEY: allowed}
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def field_range(f: dataclasses.Field) -> Range | None:
    """The `Range` a field was declared with, or None."""
    return f.metadata.get(RANGE_KEY)


def check_ranges(obj: Any, prefix: str = "") -> None:
    """Raise `ConfigError` for the first `bounded` field of ``obj`` (recursively) whose value
    lies outside its range, naming the key, the value and the range."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        dotted = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            check_ranges(value, dotted + ".")
            continue
        allowed = field_range(f)
        if allowed is None or value is None:
            continue
        values = list(value) if isinstance(value, (list, tuple)) else [value]
        for item in values:
            if not allowed.contains(item):
                raise ConfigError(out_of_range_message(dotted, value, allowed))


def out_of_range_message(dotted: str, value: Any, allowed: Range) -> str:
    """``config key 'optim.lr' is -1.0: it must be > 0 (...)``."""
    each = " (each element)" if isinstance(value, (list, tuple)) else ""
    note = f" ({allowed.note})" if allowed.note else ""
    return f"config key {dotted!r} is {value!r}: it must be{each} {allowed.describe()}{note}"
