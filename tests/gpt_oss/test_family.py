"""graft-gpt-oss's family: plugin conformance, the preset's conformance, expert parallelism."""

from __future__ import annotations

from graft.models import family_for
from graft.testing import check_installed_plugin
from graft.testing.families import check_family_preset
from graft_gpt_oss.parallel import parallelize_gpt_oss


def test_the_installed_plugin_passes_graft_testing() -> None:
    hooks = check_installed_plugin("gpt_oss")
    assert {"graft_model_families", "graft_export_slots"} <= set(hooks)


def test_tiny_preset_passes_the_family_conformance_check() -> None:
    check_family_preset("tiny-gpt-oss", num_routers=2)


def test_the_family_implements_expert_parallelism() -> None:
    family = family_for("gpt_oss")
    assert family.expert_parallel and family.parallelize is parallelize_gpt_oss
