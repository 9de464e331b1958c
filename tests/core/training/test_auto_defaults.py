"""`auto` settings (graft.config.auto): the tuned path on CUDA, the old defaults on CPU, chosen
once by the trainer and recorded in config.yaml; the default CPU run is bit-identical to one
with the old values written out."""

from __future__ import annotations

from pathlib import Path

import pytest

import graft
from graft import hookimpl
from graft.config import compose
from graft.config.auto import resolve_auto
from graft.errors import ConfigError

OLD_CPU_VALUES = ("rollout.decode=dynamic", "engine.max_tokens_per_row=0", "engine.compile=false")
COMPARED = ("loss", "grad_norm", "reward_mean", "entropy", "train_infer_logprob_diff", "tokens")


def test_auto_is_the_tuned_row_on_cuda_and_the_old_defaults_on_cpu() -> None:
    cfg = compose([])
    assert (cfg.rollout.decode, cfg.engine.max_tokens_per_row, cfg.engine.compile) == \
        ("auto", None, None)
    on_gpu, chosen = resolve_auto(cfg, "cuda")
    assert (on_gpu.rollout.decode, on_gpu.engine.max_tokens_per_row, on_gpu.engine.compile) == \
        ("static", 2048, False)
    assert on_gpu.rollout.decode_compile == "cudagraphs"  # the fused loop: graft-graphed-decode
    assert [str(c) for c in chosen] == ["rollout.decode: auto (static)",
                                        "engine.max_tokens_per_row: auto (2048)",
                                        "engine.compile: auto (false)"]
    on_cpu, _ = resolve_auto(cfg, "cpu")
    assert (on_cpu.rollout.decode, on_cpu.engine.max_tokens_per_row, on_cpu.engine.compile) == \
        ("dynamic", 0, False)
    assert cfg.rollout.decode == "auto"  # the composed config is left as it was


def test_settings_given_explicitly_are_kept() -> None:
    cfg = compose(["rollout.decode=dynamic", "engine.max_tokens_per_row=512",
                   "engine.compile=true"])
    kept, chosen = resolve_auto(cfg, "cuda")
    assert (kept.rollout.decode, kept.engine.max_tokens_per_row, kept.engine.compile) == \
        ("dynamic", 512, True) and chosen == []


def run(run_dir: Path, *overrides: str) -> list[dict]:
    return graft.train(overrides=[f"trainer.run_dir={run_dir}", "engine.device=cpu",
                                  "rollout.prompts_per_step=8", "rollout.n=4",
                                  "trainer.total_steps=3", "checkpoint.every_steps=0",
                                  "checkpoint.save_at_end=false", "export.hf_at_end=false",
                                  *overrides])


def test_default_cpu_run_matches_the_old_values_bit_for_bit(tmp_path: Path) -> None:
    auto = run(tmp_path / "auto")
    explicit = run(tmp_path / "explicit", *OLD_CPU_VALUES)
    assert [[m[k] for k in COMPARED] for m in auto] == [[m[k] for k in COMPARED] for m in explicit]
    assert auto[0]["time_to_first_step_s"] > 0 and "time_to_first_step_s" not in auto[1]
    saved = (tmp_path / "auto" / "config.yaml").read_text()
    assert "#   rollout.decode: auto (dynamic)\n" in saved
    assert "#   engine.max_tokens_per_row: auto (0)\n" in saved
    assert "rollout.decode" not in (tmp_path / "explicit" / "config.yaml").read_text()
    # config.yaml keeps the settings as written: it composes back to the same config
    again = compose(config_files=[tmp_path / "auto" / "config.yaml"])
    assert (again.rollout.decode, again.engine.max_tokens_per_row) == ("auto", None)


def test_hook_graft_auto_settings_pins_what_a_plugin_needs(graft_plugin) -> None:
    class NeedsTheHookedModel:
        @hookimpl
        def graft_auto_settings(self, cfg, device_type):
            return {"rollout.decode": "dynamic"} if device_type == "cuda" else None

    graft_plugin(NeedsTheHookedModel(), name="needs-dynamic")
    on_gpu, chosen = resolve_auto(compose(), "cuda")
    assert on_gpu.rollout.decode == "dynamic" and on_gpu.engine.max_tokens_per_row == 2048
    assert "rollout.decode: auto (dynamic, for the plugin needs-dynamic)" in map(str, chosen)
    explicit, _ = resolve_auto(compose(["rollout.decode=static"]), "cuda")
    assert explicit.rollout.decode == "static"  # a value the user wrote is never changed


def test_two_plugins_pinning_one_setting_differently_is_a_config_error(graft_plugin) -> None:
    class Static:
        @hookimpl
        def graft_auto_settings(self):
            return {"rollout.decode": "static"}

    class Dynamic:
        @hookimpl
        def graft_auto_settings(self):
            return {"rollout.decode": "dynamic"}

    graft_plugin(Static(), name="wants-static")
    graft_plugin(Dynamic(), name="wants-dynamic")
    with pytest.raises(ConfigError, match="'wants-static' and 'wants-dynamic' need rollout.decode"):
        resolve_auto(compose(), "cuda")


def test_a_pin_of_a_setting_that_is_not_auto_is_a_config_error(graft_plugin) -> None:
    class Typo:
        @hookimpl
        def graft_auto_settings(self):
            return {"rollout.decoder": "dynamic"}

    graft_plugin(Typo(), name="typo")
    with pytest.raises(ConfigError, match="pins 'rollout.decoder', which is no auto setting"):
        resolve_auto(compose(), "cuda")
