"""The training flow calls each hook at its documented moment (an installed plugin, in process)."""

from __future__ import annotations

from pathlib import Path

import pytest
from torch.distributed.fsdp import FSDPModule

from graft import hookimpl
from graft.config import compose
from graft.losses.registry import loss_agg_mode_names, policy_loss_names
from graft.training.trainer import Trainer


@pytest.fixture
def demo(plugin_sites: dict[str, Path], monkeypatch: pytest.MonkeyPatch, graft_plugin,
         clean_env: None):
    """The demo plugin registered in this process; returns a function reading its call log."""
    monkeypatch.syspath_prepend(str(plugin_sites["demo"]))
    import graft_demo.plugin as plugin

    plugin.CALLS.clear()
    graft_plugin(plugin, name="demo")
    return lambda kind: [c for c in plugin.CALLS if c[0] == kind]


def run(tmp_path: Path, *overrides: str, steps: int = 2) -> Trainer:
    cfg = compose([f"trainer.run_dir={tmp_path}", f"trainer.total_steps={steps}",
                   "model.preset=tiny-llama", "engine.device=cpu", "trainer.mode=sft",
                   *overrides])
    trainer = Trainer(cfg)
    trainer.fit()
    return trainer


def test_hook_graft_pre_shard_sees_the_bare_model_before_fsdp(demo, tmp_path: Path) -> None:
    trainer = run(tmp_path, "features.demo.greeting=hej", steps=1)
    assert demo("pre_shard") == [("pre_shard", "LlamaForCausalLM", False)]
    assert isinstance(trainer.engine.model, FSDPModule)
    assert trainer.engine.model.graft_demo_greeting == "hej"


def test_hook_graft_prepare_inputs_gets_the_pad_size(demo, tmp_path: Path) -> None:
    run(tmp_path, "engine.pad_to_length=true", "engine.pad_to_length_bucket=64")
    calls = demo("prepare_inputs")
    assert calls and all(shape[1] % 64 == 0 for _, _, shape, _ in calls)
    assert all(0 <= pad < 64 for _, pad, _, _ in calls) and any(pad > 0 for _, pad, _, _ in calls)


def test_hook_graft_step_begin_fires_every_step(demo, tmp_path: Path) -> None:
    run(tmp_path, steps=3)
    assert [c[1] for c in demo("step_begin")] == [1, 2, 3]


def test_hook_graft_step_end_metrics_reach_metrics_jsonl(demo, metrics_of, tmp_path: Path) -> None:
    run(tmp_path, steps=2)
    assert [c[1] for c in demo("step_end")] == [1, 2]
    rows = metrics_of(tmp_path)
    assert [row["demo/steps_seen"] for row in rows] == [1.0, 2.0]


def test_hook_graft_loss_agg_modes_extend_validation(demo) -> None:
    assert loss_agg_mode_names()[:5] == ["token-mean", "token-sum", "seq-mean-token-sum",
                                         "seq-mean-token-mean", "seq-mean-token-sum-norm"]
    assert "demo-max" in loss_agg_mode_names()
    assert compose(["loss.loss_agg_mode=demo-max"]).loss.loss_agg_mode == "demo-max"


def test_hook_graft_loss_aggregate_plugin_mode_trains(demo, metrics_of, tmp_path: Path) -> None:
    run(tmp_path, "loss.loss_agg_mode=demo-max")
    assert demo("loss_aggregate")
    assert [row["step"] for row in metrics_of(tmp_path)] == [1, 2]


def test_hook_graft_policy_losses_register_names(demo) -> None:
    assert {"ppo", "demo-pg"} <= set(policy_loss_names())
    assert compose(["loss.policy_loss=demo-pg"]).loss.policy_loss == "demo-pg"


def test_hook_graft_model_families_adds_a_trainable_preset(demo, tmp_path: Path) -> None:
    trainer = run(tmp_path, "model.preset=demo-qwen2")
    assert type(trainer.engine.model).__name__ == "FSDPQwen2ForCausalLM"
    assert demo("model_families")


class EndWriter:
    """Writes ``end.txt`` into the run directory at the run's end, naming the last step seen."""

    def __init__(self) -> None:
        self.last_step = 0
        self.calls: list[tuple] = []

    @hookimpl
    def graft_step_end(self, step: int) -> None:
        self.last_step = step

    @hookimpl
    def graft_train_end(self, model, cfg, run_dir: Path, is_main: bool) -> None:
        self.calls.append((type(model).__name__, cfg.trainer.total_steps, is_main))
        (run_dir / "end.txt").write_text(f"after step {self.last_step}\n")


def test_hook_graft_train_end_runs_once_after_the_last_step(graft_plugin, tmp_path: Path) -> None:
    plugin = EndWriter()
    graft_plugin(plugin, name="end-writer")
    trainer = run(tmp_path, steps=2)
    assert plugin.calls == [(type(trainer.engine.model).__name__, 2, True)]
    assert (tmp_path / "end.txt").read_text() == "after step 2\n"
    # a finished run started again trains nothing and writes nothing again
    (tmp_path / "end.txt").unlink()
    run(tmp_path, steps=2)
    assert len(plugin.calls) == 1 and not (tmp_path / "end.txt").exists()


class BeginRecorder:
    """Records ``graft_train_begin``'s arguments and the steps that end after it."""

    def __init__(self) -> None:
        self.events: list[tuple] = []

    @hookimpl
    def graft_train_begin(self, cfg, run_dir: Path, is_main: bool, start_step: int,
                          metrics: dict) -> None:
        self.events.append(("begin", start_step, sorted(metrics), is_main, run_dir,
                            cfg.trainer.total_steps))

    @hookimpl
    def graft_step_end(self, step: int) -> None:
        self.events.append(("step", step))


def test_hook_graft_train_begin_runs_once_before_the_first_step_with_the_resume_point(
        graft_plugin, tmp_path: Path) -> None:
    plugin = BeginRecorder()
    graft_plugin(plugin, name="begin-recorder")
    held_out = tmp_path / "val.jsonl"
    held_out.write_text('{"prompt": "say ab:", "response": "abababab"}\n')
    run_dir = tmp_path / "run"
    options = (f"data.val_path={held_out}", "trainer.val_every_steps=2",
               "checkpoint.every_steps=2", "checkpoint.save_at_end=false")
    run(run_dir, *options, steps=3)
    # step 0's record is the first validation, logged before the first step
    assert plugin.events == [("begin", 0, ["val/loss"], True, run_dir, 3),
                             ("step", 1), ("step", 2), ("step", 3)]
    plugin.events.clear()
    run(run_dir, *options, steps=4)  # resumes from step 2's checkpoint: step 3 again
    assert plugin.events == [("begin", 2, [], True, run_dir, 4), ("step", 3), ("step", 4)]
    plugin.events.clear()
    run(run_dir, *options, steps=4)  # finished: nothing trains, nothing begins
    assert plugin.events == []
