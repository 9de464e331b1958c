"""The plugin in real runs (in process): its hooks, metrics, config checks and errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from graft import hookimpl
from graft.config import compose
from graft.errors import ConfigError
from graft.testing import check_config_section, check_installed_plugin
from graft_router_replay.config import RouterReplayConfig

RL = ("rollout.prompts_per_step=4", "rollout.n=4", "rollout.max_new_tokens=6",
      "engine.max_tokens_per_micro_batch=128")  # 4+ micro-batches: mini_batches=2 is off-policy
OFF_POLICY = (*RL, "algorithm.mini_batches=2")
METRICS = ("router_replay/mismatch_fraction", "router_replay/fallback_rows",
           "router_replay/bytes_per_token")


def test_the_installed_plugin_passes_graft_testing() -> None:
    hooks = check_installed_plugin("router_replay")
    assert {"graft_prepare_inputs", "graft_post_forward", "graft_rollout_end"} <= set(hooks)
    assert check_config_section("router_replay", RouterReplayConfig) == {"mode": "disabled"}


def test_an_unknown_mode_is_a_config_error(fit) -> None:
    with pytest.raises(ConfigError, match="features.router_replay.mode"):
        compose(["features.router_replay.mode=R4"])


@pytest.mark.parametrize(("overrides", "message"), [
    (("features.router_replay.mode=R2", "trainer.mode=sft"),
     "trainer.mode=sft has no rollout or old-log-prob pass"),
    (("features.router_replay.mode=R2", "model.preset=tiny-llama"), "needs a MoE model"),
    (("features.router_replay.mode=R3", "rollout.decode=static"),
     "rollout.decode=static generates with a separate compiled copy"),
    (("features.router_replay.mode=R3", "features.multiturn.environment=calculator"),
     "generates an episode in several turns"),
])
def test_runs_replay_cannot_serve_are_config_errors(fit, tmp_path: Path, overrides,
                                                    message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        fit(tmp_path, *RL, *overrides)


@pytest.mark.parametrize("mode", ["R2", "R3"])
def test_hook_graft_step_end_logs_the_metrics(fit, tmp_path: Path, mode: str) -> None:
    # step 1 of the random model rewards every sample alike (no gradient); step 2 learns
    row = fit(tmp_path, *OFF_POLICY, f"features.router_replay.mode={mode}")[-1]
    assert row["router_replay/bytes_per_token"] == 2 * 2 * 2 + 1  # 2 layers x top-2 int16 + flag
    assert row["router_replay/mismatch_fraction"] > 0  # the second mini-batch, after an update
    if mode == "R2":
        assert row["router_replay/fallback_rows"] == 0.0
    else:  # the last token of every sample has no route: about one row in len(sample)
        assert 0.03 < row["router_replay/fallback_rows"] < 0.2


def test_r2_with_unchanged_weights_keeps_the_run_bit_identical(fit, tmp_path: Path) -> None:
    frozen = (*OFF_POLICY, "optim.lr=0")
    native = fit(tmp_path / "off", *frozen, steps=1)
    replayed = fit(tmp_path / "r2", *frozen, "features.router_replay.mode=R2", steps=1)
    for a, b in zip(native, replayed, strict=True):
        assert (a["loss"], a["grad_norm"], a["train_infer_logprob_diff"]) == (
            b["loss"], b["grad_norm"], b["train_infer_logprob_diff"])
    assert all(row["router_replay/mismatch_fraction"] == 0.0 for row in replayed)


def test_an_on_policy_r2_step_records_and_replays_nothing(fit, tmp_path: Path) -> None:
    native = fit(tmp_path / "off", *RL, steps=1)
    (row,) = fit(tmp_path / "r2", *RL, "features.router_replay.mode=R2", steps=1)
    assert row["loss"] == native[0]["loss"]
    assert [row[m] for m in METRICS] == [0.0, 0.0, 0.0]


def test_pad_to_length_on_and_off_give_the_same_loss(fit, tmp_path: Path) -> None:
    mode = ("features.router_replay.mode=R3", *OFF_POLICY)
    plain = fit(tmp_path / "plain", *mode, steps=1)
    padded = fit(tmp_path / "padded", *mode, "engine.pad_to_length=true",
                 "engine.pad_to_length_bucket=64", steps=1)
    for a, b in zip(plain, padded, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-7)
        assert a["router_replay/mismatch_fraction"] == b["router_replay/mismatch_fraction"]


class ScriptedRollout:
    """A rollout engine from a plugin that runs no torch model and returns no routes."""

    kind, model, llm = "scripted", None, None

    def request_extras(self, *names: str) -> None:
        from graft.rollout.types import refuse_extras

        refuse_extras(self.kind, names)

    def generate(self, prompts, spec):
        from graft.rollout.types import RolloutSample

        return [RolloutSample(list(p), [3, 4, 2], None) for p in prompts]

    def sync_weights(self):
        return {}

    def close(self) -> None:
        pass


def test_r3_with_an_engine_that_cannot_record_routes_is_a_config_error(fit, graft_plugin,
                                                                       tmp_path: Path) -> None:
    class Scripted:
        @hookimpl
        def graft_rollout_engines(self):
            return {"scripted": lambda: ScriptedRollout()}

    graft_plugin(Scripted(), name="scripted")
    with pytest.raises(ConfigError, match="the scripted engine cannot provide it: .* Use "
                                          "rollout.engine=embedded"):
        fit(tmp_path, *RL, "rollout.engine=scripted", "features.router_replay.mode=R3")


def test_r3_leaves_auto_decode_on_the_hooked_model_where_auto_would_pick_the_static_copy() -> None:
    from graft.config.auto import resolve_auto

    on_gpu, chosen = resolve_auto(compose(["features.router_replay.mode=R3"]), "cuda")
    assert on_gpu.rollout.decode == "dynamic"
    assert "rollout.decode: auto (dynamic, for the plugin router_replay)" in map(str, chosen)
    r2, _ = resolve_auto(compose(["features.router_replay.mode=R2"]), "cuda")
    assert r2.rollout.decode == "static"  # R2 records in the trainer's pass: the copy is fine
