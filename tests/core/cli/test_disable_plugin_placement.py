"""``--disable-plugin NAME`` works before the subcommand as well as after it."""

from __future__ import annotations

import json

import pytest


@pytest.mark.parametrize("argv", [["--disable-plugin", "demo", "plugins", "--json"],
                                  ["plugins", "--json", "--disable-plugin", "demo"],
                                  ["--disable-plugin", "demo", "plugins", "--json",
                                   "--disable-plugin", "broken"]])
def test_disable_plugin_before_or_after_the_subcommand(run_graft, plugin_sites,
                                                       argv: list[str]) -> None:
    result = run_graft(argv, site=plugin_sites["good"])
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert rows["demo"]["status"] == "disabled"
    assert rows["broken"]["status"] == ("disabled" if "broken" in argv else "failed")


def test_disable_plugin_before_a_subcommand_without_plugins_is_an_error(run_graft,
                                                                        tmp_path) -> None:
    result = run_graft(["--disable-plugin", "demo", "ckpt", "inspect", str(tmp_path)])
    assert result.returncode == 2
    assert "`graft ckpt` takes no --disable-plugin; set GRAFT_DISABLE_PLUGINS" in result.stderr
