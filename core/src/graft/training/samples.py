"""Generations you can read: ``<run_dir>/samples.jsonl`` and a sample on the console now and then.

Each line is one prompt of a step (``trainer.log_samples`` per step, and as many per
validation), with its first response: ``step``, ``split`` (``train`` or ``val``), the
``prompt`` as the model saw it (rendered by the chat template, special tokens kept; for an
environment's episode what its ``reset`` returned), the ``response`` (decoded without special
tokens, as the reward saw it), its ``reward``, the ``ground_truth``, the ``data_source``, and the
rewards of every response to that prompt (``group_rewards``: GRPO's group). An episode's line
also has ``turns``: the sequence after the prompt as the model saw it, in pieces
(``{"source": "model" | "environment", "text": ...}``, special tokens kept; with the ``role``
of each piece, such as ``assistant`` or ``tool``, where the sample records its
`graft.rollout.RolloutSample.turns`). With
``trainer.log_sample_responses=all`` every response of a logged prompt has its own line, with
its place in the group (``response_index``, matching ``group_rewards``). Rank 0 writes its own
share of the prompts.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graft.data.tasks import TextSample

FILE = "samples.jsonl"
CONSOLE_CHARS = 300  # a prompt or response longer than this is cut on the console (not in the file)


@dataclass(frozen=True)
class Shown:
    """One response as the model saw it: its ``prompt`` (rendered text) and, for an episode,
    its ``turns`` (``[{"source": "model" | "environment", "text": ...}]``; None otherwise)."""

    prompt: str
    turns: list[dict[str, str]] | None = None


def shown_to_model(sample: Any, tokenizer: Any) -> Shown:
    """What the model saw of one `graft.rollout.RolloutSample`: its prompt ids decoded with
    special tokens kept; for an episode (a sample with a ``loss_mask``) also its response in
    runs of the model's tokens (mask 1) and the environment's (mask 0), or in the runs its
    ``turns`` give (each with its ``role``)."""
    prompt = tokenizer.decode(list(sample.prompt_ids), skip_special_tokens=False)
    if sample.loss_mask is None:
        return Shown(prompt)
    turns: list[dict[str, str]] = []
    ids, mask = list(sample.response_ids), [float(m) for m in sample.loss_mask]
    runs = getattr(sample, "turns", None)
    if runs is not None and sum(count for _, count in runs) == len(ids):
        start = 0
        for role, count in runs:
            turns.append({"source": "model" if mask[start] else "environment", "role": role,
                          "text": tokenizer.decode(ids[start:start + count],
                                                   skip_special_tokens=False)})
            start += count
        return Shown(prompt, turns)
    start = 0
    for end in range(1, len(ids) + 1):
        if end == len(ids) or mask[end] != mask[start]:
            turns.append({"source": "model" if mask[start] else "environment",
                          "text": tokenizer.decode(ids[start:end], skip_special_tokens=False)})
            start = end
    return Shown(prompt, turns)


def sample_records(split: str, samples: Sequence[TextSample], shown: Sequence[Shown],
                   responses: Sequence[str], rewards: Sequence[float], *, group_size: int,
                   count: int, every_response: bool = False) -> list[dict[str, Any]]:
    """Records for the first ``count`` prompts: ``samples[i]``, ``shown[i]``, ``responses[i]``
    and ``rewards[i]`` are per response (``group_size`` consecutive responses share a prompt;
    ``shown`` may stop after the last logged response). One record per prompt (its first
    response), or with ``every_response`` one per response (with ``response_index``). No
    ``step`` yet (`SampleLog.write` adds it)."""
    records = []
    prompts = min(count, len(samples) // max(group_size, 1))
    for prompt in range(prompts):
        first = prompt * group_size
        group = [float(r) for r in rewards[first:first + group_size]]
        for index in range(group_size if every_response else 1):
            records.append(_record(split, samples[first + index], shown[first + index],
                                   responses[first + index], group, index, every_response))
    return records


def _record(split: str, sample: TextSample, shown: Shown, response: str, group: list[float],
            index: int, every_response: bool) -> dict[str, Any]:
    record: dict[str, Any] = {
        "split": split, "prompt": shown.prompt, "response": response, "reward": group[index],
        "ground_truth": sample.answer, "data_source": sample.data_source,
        "group_rewards": group}
    if every_response:
        record["response_index"] = index
    if shown.turns is not None:
        record["turns"] = shown.turns
    return record


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
