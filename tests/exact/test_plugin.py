"""The plugin as installed: graft.testing's conformance check, its config section, its hooks
idle while it is off, and the core's old key ``rollout.exact`` refused with the new one named."""

from __future__ import annotations

from pathlib import Path

import graft_exact.plugin as plugin
import pytest
from graft_exact.config import ExactConfig

from graft.config import compose
from graft.errors import ConfigError
from graft.testing import check_config_section, check_installed_plugin


def test_the_installed_plugin_passes_graft_testing() -> None:
    hooks = check_installed_plugin("exact")
    assert {"graft_compute", "graft_pre_shard", "graft_inference_copy",
            "graft_config_rules"} <= set(hooks)
    assert check_config_section("exact", ExactConfig) == {"enabled": False}


def test_the_old_core_key_names_the_new_one() -> None:
    with pytest.raises(ConfigError, match=r"rollout\.exact.*features\.exact\.enabled.*graft-exact"):
        compose(["rollout.exact=true"])


def test_the_old_key_in_a_yaml_names_the_new_one(tmp_path: Path) -> None:
    run = tmp_path / "run.yaml"
    run.write_text("rollout:\n  exact: true\n")
    with pytest.raises(ConfigError, match="features.exact.enabled"):
        compose([], [run])
    run.write_text("rollout:\n  exact: false\n")  # an earlier version's config.yaml
    assert compose([], [run]).features.exact.enabled is False


def test_off_every_hook_leaves_the_run_alone() -> None:
    cfg = compose([])
    assert plugin.graft_auto_settings(cfg=cfg) is None
    assert plugin.graft_auto_settings(cfg=compose(["features.exact.enabled=true"])) == \
        {"engine.compile": False}
    steps = plugin.graft_compute(step="forward", cfg=cfg)
    next(steps)  # the step runs here, outside any mode
    from graft_exact import exact_active

    assert not exact_active()
    with pytest.raises(StopIteration) as done:
        steps.send(7)
    assert done.value.value == 7


def test_the_static_decode_copy_gets_every_exact_kernel_not_only_the_attention(
        tmp_path) -> None:
    """The copy's config, copied from the policy's, already names the exact attention; its
    norms must still get the exact forward (on CUDA the one-kernel Triton norm: without it
    the rollout's log-probs differ from the trainer's on the GPU only)."""
    from graft_exact.attention import EXACT_ATTENTION
    from graft_exact.norm import _exact_norm_forward, llama_form_rms_norm

    from graft.config import compose
    from graft.training.trainer import Trainer

    cfg = compose([f"trainer.run_dir={tmp_path}", "trainer.total_steps=1", "engine.device=cpu",
                   "features.exact.enabled=true", "rollout.decode=static",
                   "rollout.decode_compile=none", "checkpoint.every_steps=0",
                   "checkpoint.save_at_end=false", "export.hf_at_end=false"])
    trainer = Trainer(cfg)
    try:
        copy = trainer.job.rollout.copy.model
        norms = [m for m in copy.modules() if llama_form_rms_norm(m)]
        assert copy.config._attn_implementation == EXACT_ATTENTION and norms
        assert all(getattr(m.forward, "__func__", None) is _exact_norm_forward for m in norms)
    finally:
        trainer.job.close()
