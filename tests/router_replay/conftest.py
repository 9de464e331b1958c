"""Shared pieces of the routing-replay tests: a model with the plugin's hooks, packed
micro-batches, and a forward that goes through the plugin's forward hooks like the engine's."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

import graft_router_replay.plugin as plugin
from graft.config import compose
from graft.engine.batch.micro_batch import MicroBatch, TokenSample, build_micro_batch
from graft.models import build_model
from graft.training.trainer import Trainer

LENGTHS = (13, 7, 21, 10)


@dataclass
class Replayable:
    """A model built from a preset, its family and config, with the plugin's hooks on it."""

    model: torch.nn.Module
    family: Any
    cfg: Any

    def batch(self, samples: Sequence[TokenSample] | None = None,
              pad_bucket: int | None = None) -> MicroBatch:
        """The samples packed as the engine packs them (one micro-batch)."""
        return build_micro_batch(samples or token_samples(), pad_token_id=0,
                                 packs_sequences=self.family.packs_sequences,
                                 pad_bucket=pad_bucket)

    def forward(self, batch: MicroBatch, phase: str) -> tuple[torch.Tensor, dict | None]:
        """``batch`` through the model between the plugin's forward hooks, as the engine runs
        it; the logits ``(R, L, V)`` and what ``graft_post_forward`` kept (stored in batch)."""
        t = batch.tensors
        plugin.graft_prepare_inputs(batch=t, layout=batch.layout, phase=phase, shard=None)
        mask = None
        if self.family.packs_sequences:
            mask = self.family.packed_attention_mask(self.model.config, t["position_ids"],
                                                     torch.float32)
        logits = self.model(input_ids=t["input_ids"], position_ids=t["position_ids"],
                            attention_mask=mask, use_cache=False).logits
        kept = plugin.graft_post_forward(layout=batch.layout, shard=None)
        if kept:
            batch.keep(kept)
        return logits, kept


def token_samples(seed: int = 0, lengths: Sequence[int] = LENGTHS) -> list[TokenSample]:
    """Reproducible samples of ``lengths`` tokens on the preset vocabulary."""
    generator = torch.Generator().manual_seed(seed)
    return [TokenSample([1, *torch.randint(3, 100, (n - 1,), generator=generator).tolist()], 3)
            for n in lengths]


class RouteObserver:
    """Keeps the ids every router used in the last forward: after the plugin's replay, or
    (``raw``) the router's own choice before it."""

    def __init__(self, routers: Sequence[torch.nn.Module], raw: bool = False) -> None:
        self.ids: list[torch.Tensor | None] = [None] * len(routers)
        self.handles = [r.register_forward_hook(self._keeper(i), prepend=raw)
                        for i, r in enumerate(routers)]

    def _keeper(self, index: int) -> Callable[..., None]:
        def keep(module: torch.nn.Module, args: Any, output: Any) -> None:
            self.ids[index] = output[2].detach().clone()

        return keep

    def stacked(self) -> torch.Tensor:
        """``(tokens, layers, k)`` ids of the last forward."""
        return torch.stack(self.ids, dim=1)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


@pytest.fixture
def replayable(graft_plugin) -> Callable[..., Replayable]:
    """``replayable(preset, mode, *overrides)``: the model with the plugin set up as a run's
    ``graft_pre_shard`` sets it up, and the step begun."""
    manager = graft_plugin(plugin, name="router_replay")
    made = []

    def make(preset: str, mode: str = "R2", *overrides: str) -> Replayable:
        cfg = compose([f"model.preset={preset}", f"features.router_replay.mode={mode}",
                       *overrides], manager=manager)
        model, family = build_model(cfg.model, seed=1)
        plugin.graft_pre_shard(model=model, cfg=cfg, mesh=None, role="policy")
        plugin.graft_step_begin()
        made.append(model)
        return Replayable(model, family, cfg)

    yield make
    from graft_router_replay.session import stop_session

    stop_session()


@pytest.fixture
def fit(graft_plugin) -> Callable[..., list[dict]]:
    """``fit(run_dir, *overrides, steps=2)``: a run in this process (one rank, CPU, nothing
    saved) with the plugin registered; its metrics rows."""
    graft_plugin(plugin, name="router_replay")

    def run(tmp_path: Path, *overrides: str, steps: int = 2) -> list[dict]:
        cfg = compose([f"trainer.run_dir={tmp_path}", f"trainer.total_steps={steps}",
                       "engine.device=cpu", "checkpoint.every_steps=0",
                       "checkpoint.save_at_end=false", "export.hf_at_end=false", *overrides])
        return Trainer(cfg).fit()

    yield run
    from graft_router_replay.session import stop_session

    stop_session()


@pytest.fixture
def observe() -> Callable[..., RouteObserver]:
    """``observe(routers, raw=False)``: a `RouteObserver` on them, removed after the test."""
    observers = []

    def make(routers: Sequence[torch.nn.Module], raw: bool = False) -> RouteObserver:
        observers.append(RouteObserver(routers, raw))
        return observers[-1]

    yield make
    for observer in observers:
        observer.remove()
