"""Pieces shared by the subcommands: the plugin options, override collection, plugin loading."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from graft.errors import ConfigError
from graft.plugins import GraftPluginManager, load_plugins


def plugin_options() -> argparse.ArgumentParser:
    """A parent parser with ``--disable-plugin NAME`` (repeatable)."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--disable-plugin", action="append", default=[], metavar="NAME",
                        dest="disable_plugin",
                        help="do not load the plugin NAME (repeatable); see `graft plugins`")
    return parent


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
    """Overrides given before and after options; anything else left over is an error."""
    overrides = list(getattr(args, "overrides", []) or [])
    for item in extra:
        if item.startswith("-") and not item.startswith("~"):
            raise ConfigError(f"unrecognized option {item!r}; see `graft --help`")
        overrides.append(item)
    return overrides


def load_for(args: argparse.Namespace) -> GraftPluginManager:
    """Load the process's plugins honouring ``--disable-plugin``."""
    return load_plugins(disabled=list(getattr(args, "disable_plugin", []) or []))
