"""``samples.jsonl``'s ``turns`` of a sample that records its runs (`RolloutSample.turns`): each
piece with its role; without them, runs of the loss mask as before (no model, no plugin)."""

from __future__ import annotations

import torch

from graft.data.tokenizer import builtin_tokenizer
from graft.rollout import RolloutSample
from graft.training.samples import shown_to_model


def test_turns_show_each_run_with_its_role() -> None:
    tokenizer = builtin_tokenizer()
    pieces = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in ("ab", "cd", "ef")]
    mask = [1.0] * len(pieces[0]) + [0.0] * len(pieces[1]) + [1.0] * len(pieces[2])
    response = [t for piece in pieces for t in piece]
    sample = RolloutSample([1], response, None, loss_mask=torch.tensor(mask),
                           turns=[("assistant", len(pieces[0])), ("tool", len(pieces[1])),
                                  ("assistant", len(pieces[2]))])
    shown = shown_to_model(sample, tokenizer)
    assert [(t["source"], t["role"]) for t in shown.turns] == [
        ("model", "assistant"), ("environment", "tool"), ("model", "assistant")]
    assert [t["text"] for t in shown.turns] == [tokenizer.decode(p) for p in pieces]
    sample.turns = None  # the loss mask's runs, without roles
    assert [(t["source"], "role" in t) for t in shown_to_model(sample, tokenizer).turns] == [
        ("model", False), ("environment", False), ("model", False)]
