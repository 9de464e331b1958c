"""The math reward: the response's final answer against the ground truth, with math-verify.

math-verify (``parse``, ``verify``) extracts answers from LaTeX (``\\boxed{}`` first, then
``$...$``) and plain expressions, turns them into sympy objects and compares them (numbers
within rounding, symbolic equality, sets, intervals, matrices): ``\\frac{1}{2}``, ``0.5`` and
``2/4`` are equal. GSM8K's ``#### 42`` (in a response, or in a ground truth that is a full GSM8K
solution) is read as the answer 42. math-verify's timeouts use ``signal.alarm``, which only
works in a process's main thread (off it, math-verify refuses with a ValueError): in
graft-reward-pool's process pool each sample runs in a worker's main thread and gets them (so
does the trainer's thread, where rewards run without that plugin); in a thread pool they are off
and ``features.reward_pool.timeout_s`` alone bounds a sample.
"""

from __future__ import annotations

import re
import threading
from functools import lru_cache
from typing import Any

from graft.errors import DataError

# GSM8K's final-answer line: "#### 1,234" (verl's gsm8k scorer reads the same).
GSM8K_ANSWER = re.compile(r"####\s*(-?[0-9.,/]+)")
BOXED = "\\boxed"
# "The answer is", "Final answer:", "answer =" (the last one counts; what follows on its line is
# the answer), as the math rewards of verl (math_dapo's "Answer:") and TRL (an anchor) read it.
ANSWER_MARKER = re.compile(r"answer\s*(?:is\s*:?|:|=)", re.IGNORECASE)
# A response that is nothing but one number, or one $...$ / \(...\) expression.
LONE_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?")
LONE_LATEX = re.compile(r"\$[^$]+\$|\\\(.+?\\\)", re.DOTALL)


def gsm8k_answer(text: str) -> str | None:
    """The number after the last ``####`` in ``text`` (commas dropped), or None."""
    found = GSM8K_ANSWER.findall(text)
    return found[-1].replace(",", "").rstrip(".") if found else None


def _timeout(seconds: int) -> int | None:
    """math-verify's timeout: ``seconds`` in a main thread, None (off) in any other."""
    return seconds if threading.current_thread() is threading.main_thread() else None


@lru_cache(maxsize=4096)
def parse_gold(answer: str, timeout_s: int | None) -> list[Any]:
    """The ground truth as math-verify objects: a GSM8K solution's ``####`` number, else the
    answer read as LaTeX inside ``\\boxed{}`` (as verl's math-verify scorer does), with a plain
    expression as the fallback."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    number = gsm8k_answer(answer)
    if number is not None:
        return parse(number, [ExprExtractionConfig()], parsing_timeout=timeout_s)
    boxed = answer if BOXED in answer else f"{BOXED}{{{answer}}}"
    gold = parse(boxed, [LatexExtractionConfig()], parsing_timeout=timeout_s)
    return gold or parse(answer, [ExprExtractionConfig()], parsing_timeout=timeout_s)


def last_boxed(text: str) -> str | None:
    """The last ``\\boxed{...}`` of ``text`` (braces balanced), or None."""
    start = text.rfind(BOXED + "{")
    if start < 0:
        return None
    depth = 0
    for end in range(start + len(BOXED), len(text)):
        depth += {"{": 1, "}": -1}.get(text[end], 0)
        if depth == 0:
            return text[start:end + 1]
    return None


def strict_answer(response: str) -> tuple[str, bool] | None:
    """The one answer of ``response`` (``extract=strict``) and whether it is LaTeX: GSM8K's
    ``#### N``, else the last ``\\boxed{}``, else the rest of the line after the last answer
    marker, else the whole response when it is one number or ``$...$`` expression."""
    number = gsm8k_answer(response)
    if number is not None:
        return number, False
    boxed = last_boxed(response)
    if boxed is not None:
        return boxed, True
    markers = list(ANSWER_MARKER.finditer(response))
    if markers:
        return _after_marker(response[markers[-1].end():].split("\n", 1)[0])
    whole = response.strip().rstrip(".")
    if LONE_NUMBER.fullmatch(whole):
        return whole.replace(",", ""), False
    if LONE_LATEX.fullmatch(whole):
        return whole, True
    return None


def _after_marker(rest: str) -> tuple[str, bool]:
    """The answer at the start of ``rest`` (the line after an answer marker): a ``$...$`` or
    ``\\(...\\)`` expression, else a number (a currency ``$`` before it dropped), else the
    line read as LaTeX."""
    rest = rest.strip().rstrip(".")
    latex = LONE_LATEX.match(rest)
    if latex is not None:
        return latex.group(0), True
    number = re.match(r"\$?\s*(" + LONE_NUMBER.pattern + ")", rest)
    if number is not None:
        return number.group(1).replace(",", ""), False
    return (f"${rest}$", True) if rest else ("", False)


def parse_response(response: str, extract: str, timeout_s: int | None) -> list[Any]:
    """The response's answer as math-verify objects, by ``features.math.extract``: ``strict``
    one answer (`strict_answer`); ``any`` ``#### N`` when present, else every candidate
    math-verify extracts (LaTeX with ``\\boxed{}`` first, then plain expressions); ``boxed``
    only a ``\\boxed{}`` answer."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    if extract == "boxed":
        if BOXED not in response:
            return []
        return parse(response, [LatexExtractionConfig(boxed_match_priority=0)],
                     parsing_timeout=timeout_s)
    if extract == "strict":
        found = strict_answer(response)
        if found is None or not found[0]:
            return []
        text, latex = found
        configs = ([LatexExtractionConfig(boxed_match_priority=0)] if latex
                   else [ExprExtractionConfig(), LatexExtractionConfig()])
        return parse(text, configs, extraction_mode="first_match", parsing_timeout=timeout_s)
    number = gsm8k_answer(response)
    if number is not None:
        return parse(number, [ExprExtractionConfig()], parsing_timeout=timeout_s)
    return parse(response, [LatexExtractionConfig(), ExprExtractionConfig()],
                 parsing_timeout=timeout_s)


def math_reward(response: str, sample: Any, cfg: Any) -> float:
    """1.0 when the answer of ``response`` equals ``sample.answer`` (math-verify), else 0.0;
    a sample without a ground truth is a `DataError` naming it."""
    answer = (sample.answer or "").strip()
    if not answer:
        raise DataError(f"{sample.origin or 'a sample'} has no ground truth for the math reward; "
                        f"set data.answer_key to the answer's key (verl: "
                        f"reward_model.ground_truth, TRL: solution)")
    section = cfg.features.math
    timeout_s = _timeout(section.parse_timeout_s)
    gold = parse_gold(answer, timeout_s)
    predicted = parse_response(response, section.extract, timeout_s)
    if not gold or not predicted:
        return 0.0
    from math_verify import verify

    return 1.0 if verify(gold, predicted, timeout_seconds=timeout_s) else 0.0
