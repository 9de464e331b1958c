"""``graft config check``: every YAML the project ships is valid, and stale keys are caught."""

from __future__ import annotations

from pathlib import Path

import pytest

from graft.config.check import yaml_files

REPO = Path(__file__).resolve().parents[3]
SHIPPED = ["core", "plugins", "examples"]


def test_every_shipped_yaml_is_valid(run_graft) -> None:
    shipped = yaml_files([REPO / p for p in SHIPPED if (REPO / p).exists()])
    assert shipped, "the project ships YAML files; the check must see them"
    result = run_graft(["config", "check", *map(str, shipped)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(shipped)} config files valid" in result.stdout


@pytest.mark.slow
def test_no_argument_checks_presets_of_graft_and_plugins(run_graft, plugin_sites) -> None:
    result = run_graft(["config", "check"], site=plugin_sites["demo"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "demo-greeting.yaml" in result.stdout


def test_stale_key_in_a_plugin_section_is_caught(run_graft, plugin_sites, tmp_path: Path) -> None:
    # The verl failure mode: a key removed from the schema but left behind in a shipped YAML.
    good = tmp_path / "good.yaml"
    good.write_text("features:\n  demo:\n    scale: 2.0\n")
    stale = tmp_path / "nested" / "stale.yaml"
    stale.parent.mkdir()
    stale.write_text("trainer:\n  total_steps: 3\nfeatures:\n  demo:\n    router_replay: true\n")
    result = run_graft(["config", "check", str(tmp_path)], site=plugin_sites["demo"])
    assert result.returncode == 2
    assert f"ok   {good}" in result.stdout and f"FAIL {stale}" in result.stdout
    assert "'features.demo.router_replay'" in result.stdout and "line 5" in result.stdout
    assert "1 of 2 config files are invalid" in result.stderr


def test_plugin_section_in_yaml_without_the_plugin_fails(run_graft, tmp_path: Path) -> None:
    path = tmp_path / "needs-demo.yaml"
    path.write_text("features:\n  demo:\n    scale: 2.0\n")
    result = run_graft(["config", "check", str(path)])
    assert result.returncode == 2 and "features has no key 'demo'" in result.stdout
