"""Pieces shared by the subcommands: the plugin options, override collection, plugin loading."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from graft.errors import ConfigError
from graft.plugins import GraftPluginManager, load_plugins

DISABLE_HELP = "do not load the plugin NAME (repeatable); see `graft plugins`"


def plugin_options() -> argparse.ArgumentParser:
    """A parent parser with ``--disable-plugin NAME`` (repeatable)."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--disable-plugin", action="append", default=[], metavar="NAME",
                        dest="disable_plugin", help=DISABLE_HELP)
    return parent


def add_global_plugin_option(parser: argparse.ArgumentParser) -> None:
    """``--disable-plugin NAME`` before the subcommand too (``graft --disable-plugin X plugins``).

    Its own destination: a subcommand's parser would overwrite a shared one with its default.
    `disabled_plugins` merges both.
    """
    parser.add_argument("--disable-plugin", action="append", default=[], metavar="NAME",
                        dest="global_disable_plugin", help=DISABLE_HELP)


def disabled_plugins(args: argparse.Namespace) -> list[str]:
    """The plugins named by ``--disable-plugin``, before and after the subcommand, in order."""
    return [*(getattr(args, "global_disable_plugin", None) or []),
            *(getattr(args, "disable_plugin", None) or [])]


def config_options() -> argparse.ArgumentParser:
    """A parent parser with ``--config FILE_OR_PRESET`` (repeatable) and the overrides."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--config", "-c", action="append", default=[], metavar="FILE_OR_PRESET",
                        help="YAML file or preset name merged onto the defaults (repeatable, "
                             "in order)")
    parent.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="Hydra-style overrides, e.g. trainer.total_steps=3")
    return parent


def collect_overrides(args: argparse.Namespace, extra: Sequence[str]) -> list[str]:
    """Overrides given before and after options; anything else left over is an error, and so
    is a ``--disable-plugin`` before a subcommand that takes none."""
    if getattr(args, "global_disable_plugin", None) and not hasattr(args, "disable_plugin"):
        raise ConfigError(f"`graft {args.command}` takes no --disable-plugin; set "
                          f"GRAFT_DISABLE_PLUGINS=NAME[,NAME...] to disable plugins for it")
    overrides = list(getattr(args, "overrides", []) or [])
    for item in extra:
        if item.startswith("-") and not item.startswith("~"):
            raise ConfigError(f"unrecognized option {item!r}; see `graft --help`")
        overrides.append(item)
    return overrides


def load_for(args: argparse.Namespace) -> GraftPluginManager:
    """Load the process's plugins honouring ``--disable-plugin``."""
    return load_plugins(disabled=disabled_plugins(args))
