"""A plugin whose declared dependency is not installed (a real distribution installed with
--no-deps): `graft plugins` reports it as failed with the pip command, instead of `loaded`
(a reward worker that cannot import a module: tests/reward_pool/test_missing_dependency.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graft.plugins import GraftPluginManager

PIP = "pip install 'graft-absent-dependency>=1.0'"


def test_graft_plugins_lists_the_missing_dependency_and_the_pip_command(
        run_graft, plugin_sites: dict[str, Path], clean_env: None) -> None:
    done = run_graft(["plugins", "--json"], site=plugin_sites["needs_dep"])
    assert done.returncode == 0, done.stderr
    (row,) = [r for r in json.loads(done.stdout) if r["name"] == "needs_dep"]
    assert row["status"] == "failed"
    assert row["error"] == ("missing dependency: graft-needs-dep-plugin 0.0.1 requires "
                            "graft-absent-dependency>=1.0, which is not installed (installed "
                            f"with --no-deps?); install it: {PIP}")
    assert "graft-absent-accelerator" not in row["error"]  # an extra's: not required
    table = run_graft(["plugins"], site=plugin_sites["needs_dep"], env={"COLUMNS": "300"})
    assert "failed: missing dependency" in table.stdout and PIP in table.stdout


def test_asking_for_its_reward_names_the_dependency(run_graft, plugin_sites: dict[str, Path],
                                                    clean_env: None) -> None:
    done = run_graft(["train", "algorithm.reward=needs_dep"], site=plugin_sites["needs_dep"])
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "plugin 'needs_dep'" in done.stderr and PIP in done.stderr
    requested = run_graft(["plugins"], site=plugin_sites["needs_dep"],
                          env={"GRAFT_PLUGINS": "needs_dep"})
    assert requested.returncode == 2 and PIP in requested.stderr, requested.stderr


def test_a_version_outside_the_declared_range_is_a_warning(plugin_sites: dict[str, Path],
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Path, clean_env: None) -> None:
    # the same distribution, with a dependency that is installed but too old
    site = tmp_path / "site"
    site.mkdir()
    for entry in plugin_sites["needs_dep"].iterdir():
        if not entry.name.endswith(".dist-info"):
            (site / entry.name).symlink_to(entry)
            continue
        (site / entry.name).mkdir()
        for file in entry.iterdir():
            text = file.read_text().replace("graft-absent-dependency>=1.0", "pluggy>=999")
            (site / entry.name / file.name).write_text(text)
    monkeypatch.syspath_prepend(str(site))
    manager = GraftPluginManager()
    manager.load()
    record = manager.records["needs_dep"]
    assert record.status == "loaded"
    assert record.warnings and "graft-needs-dep-plugin requires pluggy>=999 (" in record.warnings[0]
