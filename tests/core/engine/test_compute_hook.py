"""``graft_compute``: a plugin's wrapper runs around every forward, backward and generation step
of a run (the trainer's and the embedded engine's, both decode paths), gets the step's result
and its exception, and must be a wrapper. Tested with a plugin of its own (no graft-exact; the
steps of graft-graphed-decode's loop: tests/graphed_decode/test_plugin.py)."""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from graft import hookimpl
from graft.config import compose
from graft.engine.phase import STEPS, compute
from graft.errors import PluginError
from graft.plugins import GraftPluginManager
from graft.training.trainer import Trainer

RUN = ("engine.device=cpu", "checkpoint.every_steps=0", "checkpoint.save_at_end=false",
       "export.hf_at_end=false", "trainer.print_sample_every_steps=0", "trainer.total_steps=1",
       "rollout.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=4")


class StepWatcher:
    """Records each wrapped (step, phase) and every forward of the policy (and of the decode
    copy) that ran outside a wrapper."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, str]] = []
        self.depth = 0
        self.forwards = 0
        self.outside: list[str] = []

    @hookimpl(wrapper=True)
    def graft_compute(self, step: str, phase: str, model: Any) -> Generator[None, Any, Any]:
        assert model is not None
        self.steps.append((step, phase))
        self.depth += 1
        try:
            return (yield)
        finally:
            self.depth -= 1

    @hookimpl
    def graft_pre_shard(self, model: Any, role: str) -> None:
        model.register_forward_pre_hook(lambda module, args: self._forward(role))

    @hookimpl
    def graft_inference_copy(self, model: Any) -> None:
        if not getattr(model, "_watched", False):
            model._watched = True
            model.register_forward_pre_hook(lambda module, args: self._forward("copy"))

    def _forward(self, who: str) -> None:
        self.forwards += 1
        if self.depth == 0:
            self.outside.append(who)


@pytest.fixture
def watched(graft_plugin, tmp_path: Path):
    watcher = StepWatcher()
    graft_plugin(watcher, name="step_watcher")

    def run(*overrides: str) -> StepWatcher:
        Trainer(compose([f"trainer.run_dir={tmp_path}", *RUN, *overrides])).fit()
        return watcher

    return run


@pytest.mark.parametrize(("overrides", "expected"), [
    (("rollout.decode=dynamic",),
     {("generate", "rollout"), ("sample_logprobs", "rollout"), ("forward", "update"),
      ("gradient", "update"), ("backward", "update")}),
    (("rollout.decode=static", "rollout.decode_compile=none",
      "engine.logprob_chunk_tokens=0", "algorithm.old_logprobs=always"),
     {("generate", "rollout"), ("sample_logprobs", "rollout"),
      ("forward", "old_logprobs"), ("forward", "update"), ("backward", "update")}),
    (("trainer.mode=sft",), {("forward", "sft"), ("gradient", "sft"), ("backward", "sft")}),
])
def test_hook_graft_compute_wraps_every_step_of_a_run(watched, overrides, expected) -> None:
    watcher = watched(*overrides)
    assert set(watcher.steps) == expected
    assert {step for step, _ in watcher.steps} <= set(STEPS)
    assert watcher.forwards > 0 and watcher.outside == []  # every model forward inside one


def test_hook_graft_compute_hands_on_the_result_and_the_exception(graft_plugin) -> None:
    class PlusOne:
        seen: list[BaseException] = []

        @hookimpl(wrapper=True)
        def graft_compute(self, step: str) -> Generator[None, Any, Any]:
            try:
                return (yield) + 1
            except ValueError as exc:
                self.seen.append(exc)
                raise

    assert compute("forward", lambda: 41, phase="update", model=None, cfg=None) == 41
    plugin = PlusOne()
    graft_plugin(plugin, name="plus_one")
    assert compute("forward", lambda: 41, phase="update", model=None, cfg=None) == 42

    def fails() -> None:
        raise ValueError("in the step")

    with pytest.raises(ValueError, match="in the step"):
        compute("backward", fails, phase="update", model=None, cfg=None)
    assert [str(e) for e in plugin.seen] == ["in the step"]


def test_a_plain_graft_compute_implementation_is_refused() -> None:
    class Plain:
        @hookimpl
        def graft_compute(self, step: str) -> None:
            return None

    manager = GraftPluginManager()
    manager.load(allowlist=[])
    with pytest.raises(PluginError, match="wrapper=True"):
        manager.register(Plain(), "plain")
