"""``features.math``: how answers are extracted and how long math-verify may take."""

from __future__ import annotations

from dataclasses import dataclass

from graft.config import bounded, choice

EXTRACT_STRICT, EXTRACT_ANY, EXTRACT_BOXED = "strict", "any", "boxed"


@dataclass
class MathConfig:
    """The math reward's settings (``features.math``)."""

    # Which part of a response is its answer. strict: GSM8K's "#### N", else the last
    # \boxed{}, else what follows the last "answer is" / "Answer:" on its line, else the whole
    # response when it is one number or $...$ expression (no answer: 0). any: math-verify's
    # every candidate (LaTeX, then plain numbers and expressions); one equal to the ground
    # truth scores 1, so a list of numbers that holds it does too. boxed: only a \boxed{}
    # answer counts.
    extract: str = choice(EXTRACT_STRICT, (EXTRACT_STRICT, EXTRACT_ANY, EXTRACT_BOXED))
    # math-verify's own limit, in whole seconds, on each parse and each comparison (signal
    # based: it applies in a main thread: graft-reward-pool's processes,
    # features.reward_pool.kind=auto|process, or the trainer's thread without that plugin; in
    # a thread pool the sample's limit is features.reward_pool.timeout_s alone).
    parse_timeout_s: int = bounded(5, ge=1)
