"""The ``graft`` CLI as a user runs it: exit codes and messages (in this process, `graft_cli`),
and in subprocesses where the process is the point: the console script, what a command
imports, plugins installed in a site of their own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from graft import __version__


def plugins_json(result: subprocess.CompletedProcess[str]) -> dict[str, dict]:
    assert result.returncode == 0, result.stderr
    return {row["name"]: row for row in json.loads(result.stdout)}


def test_version(graft_cli) -> None:
    result = graft_cli(["--version"])
    assert result.returncode == 0 and result.stdout.strip() == f"graft {__version__}"


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).with_name("graft")
    result = subprocess.run([str(script), "--version"], capture_output=True, text=True)
    assert result.stdout.strip() == f"graft {__version__}"


@pytest.mark.parametrize("argv", [["--help"], ["plugins", "--json"], ["config", "show"],
                                  ["config", "check"]])
def test_light_commands_do_not_import_torch(argv: list[str]) -> None:
    code = ("import sys\nfrom graft.cli.main import main\n"
            f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_installed_plugin_shows_up_with_hooks_and_section(run_graft, plugin_sites) -> None:
    rows = plugins_json(run_graft(["plugins", "--json"], site=plugin_sites["good"]))
    demo = rows["demo"]
    assert (demo["distribution"], demo["version"], demo["status"]) == (
        "graft-demo-plugin", "0.3.1", "loaded")
    assert "graft_pre_shard" in demo["hooks"] and demo["config_sections"] == ["demo"]
    show = run_graft(["config", "show"], site=plugin_sites["good"])
    assert show.returncode == 0
    assert "\n  demo:\n    greeting: hello" in show.stdout.split("features:")[1]


def test_broken_plugin_shows_as_failed_and_the_rest_works(run_graft, plugin_sites) -> None:
    result = run_graft(["plugins", "--json"], site=plugin_sites["good"])
    broken = plugins_json(result)["broken"]
    assert broken["status"] == "failed" and "not_installed_kernels" in broken["error"]
    assert "failed to load" in result.stderr
    table = run_graft(["plugins"], site=plugin_sites["good"], env={"COLUMNS": "250"})
    assert "failed: ImportError" in table.stdout and "loaded" in table.stdout
    assert run_graft(["config", "show", "features.demo.scale=3"],
                     site=plugin_sites["good"]).returncode == 0


def test_empty_allowlist_hides_plugins(run_graft, plugin_sites) -> None:
    env = {"GRAFT_PLUGINS": ""}
    rows = plugins_json(run_graft(["plugins", "--json"], site=plugin_sites["good"], env=env))
    assert {row["status"] for row in rows.values()} == {"disabled"}
    show = run_graft(["config", "show"], site=plugin_sites["good"], env=env)
    assert "demo" not in show.stdout


def test_disable_plugin_option(run_graft, plugin_sites) -> None:
    rows = plugins_json(run_graft(["plugins", "--json", "--disable-plugin", "demo"],
                                  site=plugin_sites["good"]))
    assert rows["demo"]["status"] == "disabled"


def test_duplicate_plugin_names_exit_2_naming_both(run_graft, plugin_sites) -> None:
    result = run_graft(["plugins"], site=plugin_sites["duplicate"])
    assert result.returncode == 2
    assert "graft-demo-plugin" in result.stderr and "graft-demo-twin" in result.stderr


def test_misspelled_key_exits_2_without_traceback(graft_cli) -> None:
    result = graft_cli(["config", "show", "trainer.totl_steps=3"])
    assert result.returncode == 2
    assert "'trainer.totl_steps'" in result.stderr and "Did you mean 'total_steps'?" in result.stderr
    assert "Traceback" not in result.stderr


def test_plus_prefixed_unknown_key_exits_2(graft_cli) -> None:
    result = graft_cli(["config", "show", "+trainer.newkey=1"])
    assert result.returncode == 2 and "trainer has no key 'newkey'" in result.stderr


def test_misspelled_key_in_yaml_exits_2(graft_cli, tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("optim:\n  learning_rate: 0.1\n")
    result = graft_cli(["config", "show", "--config", str(path)])
    assert result.returncode == 2
    assert f"{path}, line 2" in result.stderr and "'optim.learning_rate'" in result.stderr


def test_graft_debug_shows_traceback(graft_cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAFT_DEBUG", "1")
    result = graft_cli(["config", "show", "trainer.totl_steps=3"])
    assert result.returncode == 2 and "Traceback" in result.stderr


def test_overrides_after_options_are_collected(run_graft, tmp_path: Path) -> None:
    result = run_graft(["config", "show", "trainer.seed=5", "--disable-plugin", "demo",
                        "trainer.total_steps=4"])
    # demo is not installed here, so disabling it is an error naming the setting (a process of
    # its own: the plugins a process loaded stay loaded)
    assert result.returncode == 2 and "--disable-plugin" in result.stderr
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    result = run_graft(["config", "show", "trainer.seed=5", "-c", str(empty),
                        "trainer.total_steps=4"])
    assert result.returncode == 0, result.stderr
    assert "seed: 5" in result.stdout and "total_steps: 4" in result.stdout


def test_unknown_option_is_rejected(graft_cli) -> None:
    result = graft_cli(["plugins", "--jsn"])
    assert result.returncode == 2 and "--jsn" in result.stderr


def test_bare_graft_prints_the_help(run_graft) -> None:
    script = Path(sys.executable).with_name("graft")
    for result in (run_graft([]), subprocess.run([str(script)], capture_output=True, text=True)):
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("usage: graft") and result.stderr == ""
        for command in ("train", "plugins", "config", "ckpt", "export"):
            assert f"    {command} " in result.stdout, result.stdout


def test_a_stray_word_without_a_command_is_still_an_error(graft_cli) -> None:
    result = graft_cli(["trainer.total_steps=3"])
    assert result.returncode == 2 and "invalid choice" in result.stderr


def test_config_check_counts_one_file_in_the_singular(graft_cli, tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("trainer:\n  total_steps: 3\n")
    result = graft_cli(["config", "check", str(good)])
    assert result.returncode == 0 and result.stdout.endswith("\n1 config file valid\n"), result.stdout
    good.write_text("trainer:\n  total_step: 3\n")
    failed = graft_cli(["config", "check", str(good)])
    assert failed.returncode == 2 and "1 of 1 config file is invalid" in failed.stderr
