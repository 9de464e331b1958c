"""The seams plugins build on, each exercised by a small in-process plugin: forward hooks in
every pass with their phase, tensors kept between passes, the model's role, the rollout engine
object, rollout engines and trainer modes from plugins, policy losses that see the whole
config and the micro-batch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from graft import hookimpl
from graft.config import compose
from graft.errors import PluginError
from graft.losses.aggregation import loss_scale_factor
from graft.rollout.types import RolloutSample
from graft.training.trainer import Trainer

RL = ("rollout.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=4")


def fit(tmp_path: Path, *overrides: str, steps: int = 1) -> Trainer:
    cfg = compose([f"trainer.run_dir={tmp_path}", f"trainer.total_steps={steps}",
                   "engine.device=cpu", "checkpoint.every_steps=0", "checkpoint.save_at_end=false",
                   "export.hf_at_end=false", *overrides])
    trainer = Trainer(cfg)
    trainer.fit()
    return trainer


class PhaseRecorder:
    """Records the phase of every forward, and keeps a per-token tensor from the old-log-prob
    pass that the update passes must find again (routing replay's record -> replay)."""

    def __init__(self) -> None:
        self.prepared: list[str] = []
        self.finished: list[str] = []
        self.replayed: list[bool] = []

    @hookimpl
    def graft_prepare_inputs(self, batch, layout, phase):
        self.prepared.append(phase)
        if phase == "update" and "recorded" in batch:
            expected = layout.pack([torch.arange(s.length) for s in layout.segments], fill=-1)
            self.replayed.append(torch.equal(batch["recorded"].cpu(), expected))

    @hookimpl
    def graft_post_forward(self, batch, layout, phase):
        self.finished.append(phase)
        if phase != "old_logprobs":
            return None
        # One value per token of each sample (its position), through the shared unpad/pack.
        per_sample = [torch.arange(len(values)) for values in layout.unpad(batch["input_ids"])]
        return {"recorded": layout.pack(per_sample, fill=-1)}


@pytest.fixture
def phases(graft_plugin) -> PhaseRecorder:
    recorder = PhaseRecorder()
    graft_plugin(recorder, name="phases")
    return recorder


def test_hook_graft_prepare_inputs_runs_in_every_forward_with_its_phase(phases: PhaseRecorder,
                                                                         tmp_path: Path) -> None:
    fit(tmp_path, *RL, "loss.kl_coef=0.1", "algorithm.mini_batches=2",
        "engine.max_tokens_per_micro_batch=16")
    kinds = list(dict.fromkeys(phases.prepared))
    assert kinds == ["old_logprobs", "ref_logprobs", "update"]
    assert phases.prepared.count("old_logprobs") == phases.prepared.count("ref_logprobs") >= 2
    assert phases.prepared == phases.finished

    phases.prepared.clear()
    fit(tmp_path / "sft", "trainer.mode=sft", "model.preset=tiny-llama")
    assert set(phases.prepared) == {"sft"}


def test_on_policy_steps_run_no_old_logprob_pass(phases: PhaseRecorder, metrics_of,
                                                 tmp_path: Path) -> None:
    fit(tmp_path, *RL)  # ppo_epochs=1, mini_batches=1: the ratio is 1 by construction
    assert set(phases.prepared) == {"update"}
    # the mismatch is still reported, from the update's own log-probs
    skipped = metrics_of(tmp_path)[0]
    assert 0 < skipped["train_infer_logprob_diff"] < 1e-4
    phases.prepared.clear()
    fit(tmp_path / "always", *RL, "algorithm.old_logprobs=always")
    assert list(dict.fromkeys(phases.prepared)) == ["old_logprobs", "update"]
    recomputed = metrics_of(tmp_path / "always")[0]
    # the same step either way: the old log-probs of a single update equal its own
    for key in ("loss", "grad_norm", "train_infer_logprob_diff"):
        assert recomputed[key] == skipped[key], key


def test_hook_graft_post_forward_keeps_tensors_for_later_passes(phases: PhaseRecorder,
                                                               tmp_path: Path) -> None:
    fit(tmp_path, *RL, "algorithm.mini_batches=2", "engine.max_tokens_per_micro_batch=16",
        "engine.pad_to_length=true", "engine.pad_to_length_bucket=8")
    assert phases.replayed and all(phases.replayed)


def test_hook_graft_pre_shard_gets_the_role(graft_plugin, tmp_path: Path) -> None:
    roles = []

    class Roles:
        @hookimpl
        def graft_pre_shard(self, model, role, meshes):
            roles.append((role, meshes["ep"].size(), any(p.requires_grad for p in model.parameters())))

    graft_plugin(Roles(), name="roles")
    fit(tmp_path, *RL, "loss.kl_coef=0.1")
    assert roles == [("policy", 1, True), ("reference", 1, False)]


def test_hook_graft_rollout_begin_gets_the_engine_object(graft_plugin, tmp_path: Path) -> None:
    seen = []

    class Engines:
        @hookimpl
        def graft_rollout_begin(self, engine, rollout, model):
            seen.append((engine, rollout.kind, rollout.model is model, rollout.llm))
            with pytest.raises(PluginError, match="cannot return the per-request output"):
                rollout.request_extras("routed_experts")

        @hookimpl
        def graft_rollout_end(self, samples, rollout):
            seen.append(all(s.engine_extras == {} for s in samples))

    graft_plugin(Engines(), name="engines")
    fit(tmp_path, *RL)
    assert seen == [("embedded", "embedded", True, None), True]


class ScriptedRollout:
    """A rollout engine from a plugin: answers every prompt with the same tokens and reports no
    log-probs, so the trainer computes them (phase ``rollout_logprobs``)."""

    kind = "scripted"
    model = None
    llm = None

    def __init__(self, *, tokenizer) -> None:
        self.answer = tokenizer.encode("ab", add_special_tokens=False) + [tokenizer.eos_token_id]

    def request_extras(self, *names: str) -> None:
        raise PluginError("no extras")

    def generate(self, prompts, spec):
        return [RolloutSample(list(p), list(self.answer), None) for p in prompts]

    def sync_weights(self):
        return {"weight_sync_s": 0.0}

    def close(self) -> None:
        pass


def test_hook_graft_rollout_engines_adds_a_selectable_engine(graft_plugin, phases: PhaseRecorder,
                                                             metrics_of, tmp_path: Path) -> None:
    class Scripted:
        @hookimpl
        def graft_rollout_engines(self):
            return {"scripted": lambda *, tokenizer: ScriptedRollout(tokenizer=tokenizer)}

    graft_plugin(Scripted(), name="scripted")
    fit(tmp_path, *RL, "rollout.engine=scripted", "algorithm.mini_batches=2",
        "engine.max_tokens_per_micro_batch=16")
    assert phases.prepared[0] == "rollout_logprobs"
    row = metrics_of(tmp_path)[0]
    assert row["train_infer_logprob_diff"] == 0.0  # the trainer's own log-probs were used
    assert row["response_length"] == 3.0


def test_hook_graft_trainer_modes_adds_a_selectable_job(graft_plugin, metrics_of,
                                                        tmp_path: Path) -> None:
    class CountingJob:
        def __init__(self, cfg) -> None:
            self.cfg, self.steps = cfg, 0

        def attach(self, engine, run_dir) -> None:
            self.params = sum(p.numel() for p in engine.model.parameters())

        def step(self, engine):
            self.steps += 1
            return {"loss": float(self.steps), "tokens": 1, "params": float(self.params)}

        def state_dict(self):
            return {"steps": self.steps}

        def load_state_dict(self, state) -> None:
            self.steps = state["steps"]

        def close(self) -> None:
            pass

    class Modes:
        @hookimpl
        def graft_trainer_modes(self):
            return {"count": lambda *, cfg: CountingJob(cfg)}

    graft_plugin(Modes(), name="modes")
    fit(tmp_path, "trainer.mode=count", steps=2)
    assert [row["loss"] for row in metrics_of(tmp_path)] == [1.0, 2.0]
    assert compose(["trainer.mode=count"]).trainer.mode == "count"


def test_policy_losses_get_the_root_config_and_the_micro_batch(graft_plugin,
                                                               tmp_path: Path) -> None:
    seen = []

    def weighted(*, logp, advantages, root_cfg, tensors):
        seen.append((root_cfg.trainer.mode, sorted(tensors)))
        return -advantages * logp, {}

    def legacy(*, logp, old_logp, advantages, mask, cfg):  # written before the new keywords
        seen.append(("legacy", cfg.clip_ratio_low))
        return -advantages * logp, {}

    class Losses:
        @hookimpl
        def graft_policy_losses(self):
            return {"weighted": weighted, "legacy": legacy}

    graft_plugin(Losses(), name="losses")
    fit(tmp_path / "a", *RL, "loss.policy_loss=weighted")
    fit(tmp_path / "b", *RL, "loss.policy_loss=legacy")
    mode, names = seen[0]
    assert mode == "rl" and {"advantages", "rollout_logprobs", "loss_mask"} <= set(names)
    assert ("legacy", 0.2) in seen


def test_loss_scale_factor_has_one_source() -> None:
    assert loss_scale_factor(compose(["rollout.max_new_tokens=12"])) == 12.0
    assert loss_scale_factor(compose(["trainer.mode=sft", "data.max_response_tokens=33"])) == 33.0
    assert loss_scale_factor(compose(["loss.loss_scale_factor=5"])) == 5.0
