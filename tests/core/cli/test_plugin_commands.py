"""``graft_cli_commands``: a plugin's subcommand on the ``graft`` command line, run like the
core's (exit codes, graft's errors as one line), listed by ``graft --help``; two commands of
one name are a plugin error; a core command does not load plugins to build its parser."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest

from graft import hookimpl
from graft.errors import DataError


def add_hello(subparsers) -> None:
    parser = subparsers.add_parser("hello", help="say hello")
    parser.add_argument("name")
    parser.set_defaults(run=hello)


def hello(args: argparse.Namespace) -> int:
    if args.name == "nobody":
        raise DataError("nobody to greet: give a name")
    print(f"hello {args.name}")
    return 0


class Greeter:
    """A plugin adding ``graft hello NAME``."""

    @hookimpl
    def graft_cli_commands(self):
        return [SimpleNamespace(add_parser=add_hello)]


def test_hook_graft_cli_commands_adds_a_subcommand_run_like_the_cores(graft_cli,
                                                                     graft_plugin) -> None:
    graft_plugin(Greeter(), name="greeter")
    result = graft_cli(["hello", "Ada"])
    assert (result.returncode, result.stdout) == (0, "hello Ada\n")
    failed = graft_cli(["hello", "nobody"])
    assert failed.returncode == 2 and failed.stderr == "graft: error: nobody to greet: give a name\n"
    assert "    hello " in graft_cli(["--help"]).stdout


def test_a_plugin_command_named_like_a_core_one_is_a_plugin_error(graft_cli, graft_plugin) -> None:
    def add_export(subparsers) -> None:
        subparsers.add_parser("export")

    class Clash:
        @hookimpl
        def graft_cli_commands(self):
            return [SimpleNamespace(add_parser=add_export)]

    graft_plugin(Clash(), name="clash")
    result = graft_cli(["something"])
    assert result.returncode == 2 and "named like another" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_core_command_builds_its_parser_without_plugins(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    from graft.cli import main

    def refuse(disabled=()):
        raise AssertionError("plugins loaded to parse a core command")

    monkeypatch.setattr(main, "plugin_commands", refuse)
    for argv in (["config", "show"], ["--disable-plugin", "x", "plugins"], ["train", "-c", "a"]):
        main.build_parser(argv)
    with pytest.raises(AssertionError):
        main.build_parser(["plot", "run"])
