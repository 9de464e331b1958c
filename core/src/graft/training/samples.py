"""Generations you can read: ``<run_dir>/samples.jsonl`` and a sample on the console now and then.

Each line is one prompt of a step (``trainer.log_samples`` per step, and as many per
validation), with its first response: ``step``, ``split`` (``train`` or ``val``), the
``prompt`` as the model saw it (rendered by the chat template, special tokens kept), the
``response`` (decoded without special tokens, as the reward saw it), its ``reward``, the
``ground_truth``, the ``data_source``, and the rewards of every response to that prompt
(``group_rewards``: GRPO's group). Rank 0 writes its own share of the prompts.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from graft.data.tasks import TextSample

FILE = "samples.jsonl"
CONSOLE_CHARS = 300  # a prompt or response longer than this is cut on the console (not in the file)


def sample_records(split: str, samples: Sequence[TextSample], prompts: Sequence[str],
                   responses: Sequence[str], rewards: Sequence[float], *, group_size: int,
                   count: int) -> list[dict[str, Any]]:
    """Records for the first ``count`` prompts: ``samples[i]``, ``responses[i]`` and
    ``rewards[i]`` are per response (``group_size`` consecutive responses share a prompt),
    ``prompts[p]`` is prompt ``p``'s rendered text. No ``step`` yet (`SampleLog.write` adds it)."""
    records = []
    for prompt in range(min(count, len(prompts))):
        first = prompt * group_size
        sample = samples[first]
        records.append({
            "split": split, "prompt": prompts[prompt], "response": responses[first],
            "reward": float(rewards[first]), "ground_truth": sample.answer,
            "data_source": sample.data_source,
            "group_rewards": [float(r) for r in rewards[first:first + group_size]]})
    return records


class SampleLog:
    """Appends records to ``<run_dir>/samples.jsonl``; does nothing when not ``enabled``."""

    def __init__(self, run_dir: Path, *, enabled: bool) -> None:
        self.path = Path(run_dir) / FILE
        self.enabled = enabled

    def write(self, step: int, records: Sequence[dict[str, Any]]) -> None:
        """One line per record, each with ``step`` first."""
        if not self.enabled or not records:
            return
        with self.path.open("a", encoding="utf-8") as handle:
            for record in records:
                handle.write(json.dumps({"step": step, **record}, ensure_ascii=False) + "\n")


def truncate_samples(run_dir: Path, last_step: int) -> None:
    """Drop the lines of steps after ``last_step`` (written before a crash; the resumed run
    writes them again)."""
    from graft.checkpoint.layout import write_atomically

    path = Path(run_dir) / FILE
    if not path.is_file():
        return
    kept = [line for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip() and json.loads(line).get("step", 0) <= last_step]
    write_atomically(path, "".join(line + "\n" for line in kept))


def _short(text: str) -> str:
    return text if len(text) <= CONSOLE_CHARS else text[:CONSOLE_CHARS] + " ..."


def format_sample(step: int, record: dict[str, Any]) -> str:
    """The console's view of a record: a header line, then the prompt and the response."""
    truth = f"  ground truth {record['ground_truth']!r}" if record.get("ground_truth") else ""
    return (f"sample (step {step}, {record['split']}): reward {record['reward']:.4g}{truth}\n"
            f"  prompt:   {_short(record['prompt'])!r}\n"
            f"  response: {_short(record['response'])!r}")
