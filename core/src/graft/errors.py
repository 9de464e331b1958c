"""User-facing errors.

Every error a user can fix (bad config, bad data, bad checkpoint, a missing or broken plugin) is a
`GraftError`. The CLI prints its message without a traceback (unless ``GRAFT_DEBUG=1``) and exits
with `GraftError.exit_code`. Anything else is a bug in Graft or a plugin and keeps its traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["CheckpointError", "ConfigError", "DataError", "GraftError", "PluginError", "did_you_mean",
           "few"]


class GraftError(Exception):
    """An error caused by user input; the message says what is wrong and how to fix it."""

    exit_code: int = 2


class ConfigError(GraftError):
    """The composed config is invalid: unknown key, wrong type, bad value."""


class PluginError(GraftError):
    """A plugin the user asked for is missing or broken, or two plugins conflict."""


class DataError(GraftError):
    """A dataset file is missing or malformed."""


class CheckpointError(GraftError):
    """A checkpoint is missing, truncated, corrupted or incompatible with the config."""


def did_you_mean(name: str, candidates: Iterable[str], *, limit: int = 3) -> str:
    """Return ``" Did you mean 'x'?"`` for the closest candidates, or ``""`` when none is close."""
    matches = difflib.get_close_matches(name, sorted(set(candidates)), n=limit, cutoff=0.6)
    if not matches:
        return ""
    return " Did you mean " + " or ".join(repr(m) for m in matches) + "?"


def few(names: Iterable[str], most: int = 3) -> str:
    """Up to ``most`` of ``names`` joined with commas, and how many more, for messages."""
    names = list(names)
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")
