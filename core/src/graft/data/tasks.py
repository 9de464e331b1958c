"""Built-in synthetic tasks: prompt/response pairs a tiny model learns in minutes, with rewards.

Each task is deterministic given a seed, so a run is reproducible without data files.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class TextSample:
    """One example: the prompt, the reference response, and the answer a reward checks."""

    prompt: str
    response: str
    answer: str


def _letters(rng: random.Random, low: int, high: int) -> str:
    return "".join(rng.choice(string.ascii_lowercase[:8]) for _ in range(rng.randint(low, high)))


def copy_task(rng: random.Random) -> TextSample:
    """Repeat a short string of letters."""
    word = _letters(rng, 3, 8)
    return TextSample(f"copy {word}:", word, word)


def reverse_task(rng: random.Random) -> TextSample:
    """Reverse a short string of letters."""
    word = _letters(rng, 3, 6)
    return TextSample(f"reverse {word}:", word[::-1], word[::-1])


def add_task(rng: random.Random) -> TextSample:
    """Add two numbers below 50."""
    a, b = rng.randint(0, 49), rng.randint(0, 49)
    return TextSample(f"{a}+{b}=", str(a + b), str(a + b))


def pattern_task(rng: random.Random) -> TextSample:
    """Continue with a fixed pattern after any prompt; the easiest task for an RL smoke run."""
    return TextSample(f"say {_letters(rng, 1, 3)}:", "abab", "abab")


TASKS: dict[str, Callable[[random.Random], TextSample]] = {
    "copy": copy_task,
    "reverse": reverse_task,
    "add": add_task,
    "pattern": pattern_task,
}


def exact_match_reward(response: str, answer: str) -> float:
    """1.0 when the response (whitespace-trimmed) equals the answer, else 0.0."""
    return 1.0 if response.strip() == answer.strip() else 0.0


def generate_samples(task: str, count: int, seed: int) -> list[TextSample]:
    """``count`` samples of ``task``, reproducible from ``seed``."""
    rng = random.Random(seed)
    make = TASKS[task]
    return [make(rng) for _ in range(count)]
