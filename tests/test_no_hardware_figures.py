"""No measured hardware figure in the sources of the core and the plugins (issue 41): a docstring,
comment or schema description that quotes one goes stale with the next measurement, and the same
number then has to be corrected in several places. Measurements live in bench/README.md's table
(generated from bench/results/) and bench/HISTORY.md; a source points there instead."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_NUMBER = r"\d+(?:[.,]\d+)*"
_DURATION = rf"\b{_NUMBER}(?:\s?-\s?{_NUMBER})?\s?(?:s|ms|us|µs|sec|seconds|min|minutes)\b"
FIGURES = {
    "a GPU or accelerator model": re.compile(
        r"\b(?:[ABHV]100|H200|H20|B200|GB200|A10G|A6000|L40S?|MI[23]\d\dX?|RTX ?\d{4})\b"),
    "a throughput": re.compile(
        rf"\b{_NUMBER}\s?(?:[a-z-]+\s){{0,2}}(?:[KMGT]i?B/s|[GT]FLOP/?s|tok(?:en)?s?/s|samples/s)"),
    "a speed-up": re.compile(
        r"\b\d+(?:\.\d+)?x\b[^\n]{0,80}\b(?:faster|slower|speed-?up|than|the default|cuBLAS|"
        r"throughput|tokens/s|step)\b|\b(?:faster|slower|speed-?up)\b[^\n]{0,40}\b\d+(?:\.\d+)?x\b"),
    "a share of a measured time": re.compile(
        rf"\b{_NUMBER}\s?%\s(?:faster|slower|overhead|of (?:a|the|its)\b[^\n]{{0,40}}"
        r"\b(?:step|rollout|GPU time|run time))"),
}
# Two durations in a line (or across two lines of one comment), e.g. "43 s ... 27 s" or
# "130 ms of its 0.88 s": a measured timing against another. One duration alone is usually a
# setting or a limit ("SIGKILL 30 s later").
DURATION = re.compile(_DURATION)


def sources() -> list[Path]:
    roots = [REPO / "core" / "src", *sorted(REPO.glob("plugins/*/src"))]
    return [path for root in roots for path in sorted(root.glob("**/*.py"))]


def figures(text: str) -> list[tuple[int, str, str]]:
    """(line number, what, the line) for every hardware figure in ``text``."""
    lines = text.splitlines()
    found = []
    for number, line in enumerate(lines, 1):
        for what, pattern in FIGURES.items():
            if pattern.search(line):
                found.append((number, what, line.strip()))
        following = lines[number] if number < len(lines) else ""
        if len(DURATION.findall(line)) >= 2 or (DURATION.search(line) and DURATION.search(following)):
            found.append((number, "two measured durations", line.strip()))
    return found


def test_no_source_quotes_a_hardware_figure() -> None:
    found = [f"{path.relative_to(REPO)}:{number}: {what}: {line}"
             for path in sources() for number, what, line in figures(path.read_text())]
    assert not found, ("measured hardware figures in the sources; move them to bench/ (the "
                       "results table or bench/HISTORY.md) and point there (see bench/README.md):\n"
                       + "\n".join(found))


@pytest.mark.parametrize("text", [
    '    # 13.8x the dynamic decode of the same run on an H200',
    '    """Rollout at 38,205 tokens/s; the step from 12.0 s to 1.24 s."""',
    "# the first step began 43.1 s after the start (target 90 s); warm, 27 s",
    "# with the folder the first run filled, 43 s ... 27 s",
    "about 130 ms of its 0.88 s of GPU time",
    "RL steps before the first save took 8-20 s against 0.5-3 s",
    "exports at 2,045 GB/s, 96.5% of the device copy rate",
    "545 model TFLOP/s",
    "rollout at 2,008 generated tokens/s",
    "the exact product is 1.6x slower than cuBLAS",
    "about 1% of a Llama-8B step at 32K tokens; 12% faster",
    "Measured on an H100 80GB",
])
def test_a_measured_figure_is_found(text: str) -> None:
    assert figures(text), text


@pytest.mark.parametrize("text", [
    "SEPARATE_COPY_BYTES = 1 << 20",
    '    """Seconds since this process started (10 ms resolution)."""',
    "    then stops its ranks, SIGKILL 30 s later.",
    "    return f\"{rate:.1f} GB/s\"",
    "tokens_per_s = tokens / seconds  # tok/s",
    "a 64 x 128 tile gives a 2048-wide output 16 programs at 8 rows",
    "mask = 0x1F & flags",
    "    (~1.6 nats of log-prob error, measured). Applied only to the 0.32 series on CPU.",
    "counts 132 multiprocessors under the interpreter",
    "# 24 bytes per hidden value, 96 KiB per token at Llama-8B shapes",
])
def test_a_constant_or_unit_is_not_a_figure(text: str) -> None:
    assert not figures(text), figures(text)
