"""Built-in synthetic tasks: prompt/response pairs a tiny model learns in minutes, with rewards.

Each task is deterministic given a seed, so a run is reproducible without data files.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# A chat prompt: messages {"role": ..., "content": ...}, rendered with the chat template.
Messages = list[dict[str, Any]]


@dataclass(frozen=True)
class TextSample:
    """One example: the prompt, the reference response, and the answer a reward checks.

    ``prompt`` is text (tokenized as it is) or chat messages (`Messages`, rendered with the
    chat template). ``response`` is text, or for SFT on chat data the messages that follow the
    prompt's (their assistant turns are trained: `graft.data.conversations`).
    ``answer`` is None when the data has none (``data.answer_key=null``).
    ``origin`` says where it comes from, for error messages: ``"<file>, line <N>"`` (JSONL,
    1-based) or ``"<file>, row <N>"`` (Parquet, 1-based); empty for synthetic tasks.
    ``data_source`` and ``extra_info`` are the record's own fields of those names (verl's
    layout), which rewards may use (``algorithm.reward=auto`` picks the reward by
    ``data_source``); empty and None when absent.
    """

    prompt: str | Messages
    response: str | Messages
    answer: str | None
    origin: str = ""
    data_source: str = ""
    extra_info: dict[str, Any] | None = None


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
    """Answer any prompt with a fixed pattern: what a random-init tiny model learns by RL."""
    return TextSample(f"say {_letters(rng, 1, 3)}:", "abababab", "abababab")


def exact_match_reward(response: str, sample: TextSample) -> float:
    """1.0 when the response (whitespace-trimmed) equals the answer, else 0.0."""
    return 1.0 if response.strip() == _answer_of(sample).strip() else 0.0


def positional_match_reward(response: str, sample: TextSample) -> float:
    """The fraction of the answer's characters the response has at the same position.

    Partial credit, so a policy that starts from random text still sees a signal.
    """
    answer = _answer_of(sample)
    return sum(a == b for a, b in zip(response, answer, strict=False)) / max(len(answer), 1)


def _answer_of(sample: TextSample) -> str:
    """The answer a rule-based reward compares with; a `DataError` naming the sample if none."""
    if sample.answer is None:
        from graft.errors import DataError

        raise DataError(f"{sample.origin or 'a sample'} has no answer to compare the response "
                        f"with (data.answer_key=null); set data.answer_key to the answer's key, "
                        f"or choose a reward that needs none (algorithm.reward)")
    return sample.answer


@dataclass(frozen=True)
class Task:
    """A synthetic task: how to make a sample, and its default reward."""

    make: Callable[[random.Random], TextSample]
    reward: Callable[[str, TextSample], float]


TASKS: dict[str, Task] = {
    "copy": Task(copy_task, exact_match_reward),
    "reverse": Task(reverse_task, exact_match_reward),
    "add": Task(add_task, exact_match_reward),
    "pattern": Task(pattern_task, positional_match_reward),
}


def generate_samples(task: str, count: int, seed: int) -> list[TextSample]:
    """``count`` samples of ``task``, reproducible from ``seed``."""
    rng = random.Random(seed)
    make = TASKS[task].make
    return [make(rng) for _ in range(count)]
