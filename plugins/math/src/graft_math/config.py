"""``features.math``: how answers are extracted and how long math-verify may take."""

from __future__ import annotations

from dataclasses import dataclass

from graft.config import bounded, choice

EXTRACT_ANY, EXTRACT_BOXED = "any", "boxed"


@dataclass
class MathConfig:
    """The math reward's settings (``features.math``)."""

    # Which part of a response is its answer. any: GSM8K's "#### N" when present, else the
    # last \boxed{}, else LaTeX ($...$), else the last plain number or expression. boxed: only
    # a \boxed{} answer counts (a response without one scores 0).
    extract: str = choice(EXTRACT_ANY, (EXTRACT_ANY, EXTRACT_BOXED))
    # math-verify's own limit, in whole seconds, on each parse and each comparison (signal
    # based: it applies in a process pool, algorithm.reward_pool=auto|process; in threads the
    # sample's limit is algorithm.reward_timeout_s alone).
    parse_timeout_s: int = bounded(5, ge=1)
