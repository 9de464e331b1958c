"""``graft config check`` without paths: the presets of Graft and of the loaded plugins, and the
``examples/`` folder of the current folder (the repository's, when run from a checkout)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_from_a_checkout_it_checks_the_repository_examples(run_graft) -> None:
    examples = sorted((REPO / "examples").glob("*.yaml"))
    assert examples, "the repository ships example configs"
    result = run_graft(["config", "check"], cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"  {len(examples)} files: examples/ (example configs in the current folder)" \
        in result.stdout
    for path in examples:
        assert f"ok   examples/{path.name}\n" in result.stdout
    assert "config files valid" in result.stdout


def test_a_stale_example_fails_next_to_the_plugin_presets(run_graft, plugin_sites,
                                                          tmp_path: Path) -> None:
    (tmp_path / "examples" / "nested").mkdir(parents=True)
    (tmp_path / "examples" / "good.yaml").write_text("trainer:\n  total_steps: 3\n")
    (tmp_path / "examples" / "nested" / "stale.yml").write_text("trainer:\n  total_step: 3\n")
    result = run_graft(["config", "check"], cwd=tmp_path, site=plugin_sites["demo"])
    assert result.returncode == 2
    assert "presets in " in result.stdout and "demo-greeting.yaml" in result.stdout
    assert "  2 files: examples/ (example configs" in result.stdout
    assert "ok   examples/good.yaml" in result.stdout
    assert "FAIL examples/nested/stale.yml" in result.stdout and "total_step" in result.stdout
    assert "1 of 3 config files are invalid" in result.stderr


def test_elsewhere_it_checks_no_examples(run_graft, tmp_path: Path) -> None:
    result = run_graft(["config", "check"], cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "example configs" not in result.stdout and "FAIL" not in result.stdout
