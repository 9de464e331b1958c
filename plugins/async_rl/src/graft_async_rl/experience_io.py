"""A worker's share of a step's experience as plain data: sent to the trainers pickled, and
kept in a checkpoint's ``trainer.json`` as JSON (every float exactly: float32 log-probs and
float64 rewards round-trip through Python floats)."""

from __future__ import annotations

from typing import Any

import torch

from graft.rollout import RolloutSample

TENSOR = "__tensor__"


def tensor_data(value: torch.Tensor | None) -> Any:
    """``value`` as JSON-ready data (None stays None)."""
    if value is None:
        return None
    return {TENSOR: str(value.dtype).removeprefix("torch."), "shape": list(value.shape),
            "values": value.reshape(-1).tolist()}


def tensor_from(data: Any) -> torch.Tensor | None:
    """The tensor `tensor_data` wrote."""
    if data is None:
        return None
    return torch.tensor(data["values"], dtype=getattr(torch, data[TENSOR])).view(data["shape"])


def sample_data(sample: RolloutSample) -> dict[str, Any]:
    """One sample as data (its ``engine_extras``, which plugins turn into ``extras`` during the
    rollout, stay behind)."""
    return {"prompt_ids": list(sample.prompt_ids), "response_ids": list(sample.response_ids),
            "logprobs": tensor_data(sample.logprobs), "loss_mask": tensor_data(sample.loss_mask),
            "extras": {name: tensor_data(t) for name, t in sample.extras.items()}}


def sample_from(data: dict[str, Any]) -> RolloutSample:
    """The sample `sample_data` wrote."""
    return RolloutSample(data["prompt_ids"], data["response_ids"], tensor_from(data["logprobs"]),
                         {name: tensor_from(t) for name, t in data["extras"].items()},
                         loss_mask=tensor_from(data["loss_mask"]))


def part_data(*, step: int, worker: int, version: int, positions: list[int],
              samples: list[RolloutSample], rewards: torch.Tensor, rollout_s: float,
              metrics: dict[str, float], idle_s: float,
              token_versions: list[list[tuple[int, int]]] | None = None) -> dict[str, Any]:
    """A worker's part of step ``step``: the prompts at ``positions`` of the step's batch,
    ``rollout.n`` samples each, generated with policy ``version``; under partial rollouts each
    sample's ``token_versions`` as runs ``[(version, token count), ...]``."""
    return {"step": step, "worker": worker, "version": version, "positions": positions,
            "samples": [sample_data(s) for s in samples], "rewards": rewards.tolist(),
            "rollout_s": rollout_s, "metrics": metrics, "idle_s": idle_s,
            "token_versions": (None if token_versions is None
                               else [[list(run) for run in runs] for runs in token_versions])}
