"""graft-plot passes graft.testing's conformance check and adds `plot` to the command line."""

from __future__ import annotations

from graft.testing import check_installed_plugin


def test_the_installed_plugin_conforms() -> None:
    assert check_installed_plugin("plot") == ["graft_cli_commands"]


def test_graft_help_lists_plot(run_graft) -> None:
    result = run_graft(["--help"])
    assert result.returncode == 0 and "    plot " in result.stdout
