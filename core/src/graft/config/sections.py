"""Plugin config sections: validating one, and building the root schema that holds them all."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from omegaconf import OmegaConf

from graft.config.schema import GraftConfig
from graft.errors import PluginError


def validate_section(item: Any, *, plugin_name: str) -> tuple[str, type]:
    """Check one ``(section_name, dataclass)`` pair returned by ``graft_config_sections``.

    The name must be a lowercase identifier; the schema a dataclass whose every field has a
    default and whose types OmegaConf supports. Raises `PluginError` naming the plugin.
    """
    if not (isinstance(item, tuple) and len(item) == 2):
        raise PluginError(
            f"plugin {plugin_name!r}: graft_config_sections must return (name, dataclass) pairs, "
            f"got {item!r}"
        )
    name, schema = item
    if not (isinstance(name, str) and name.isidentifier() and name == name.lower()):
        raise PluginError(
            f"plugin {plugin_name!r}: config section name {name!r} must be a lowercase Python "
            f"identifier (it becomes the key features.<name>)"
        )
    if not (isinstance(schema, type) and dataclasses.is_dataclass(schema)):
        raise PluginError(
            f"plugin {plugin_name!r}: config section {name!r} must be a dataclass type, got {schema!r}"
        )
    for f in dataclasses.fields(schema):
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise PluginError(
                f"plugin {plugin_name!r}: field {f.name!r} of config section {name!r} "
                f"({schema.__qualname__}) has no default; every field needs one so the section "
                f"composes without user input"
            )
    try:
        OmegaConf.structured(schema)
    except Exception as exc:  # noqa: BLE001 - OmegaConf raises several unrelated types here
        raise PluginError(
            f"plugin {plugin_name!r}: config section {name!r} ({schema.__qualname__}) is not a "
            f"valid structured config: {exc}"
        ) from exc
    return name, schema


def build_root_schema(sections: Mapping[str, type]) -> type:
    """Return the root dataclass: `GraftConfig` plus ``features`` holding one field per section."""
    features = dataclasses.make_dataclass(
        "Features",
        [(name, schema, dataclasses.field(default_factory=schema))
         for name, schema in sorted(sections.items())],
    )
    features.__doc__ = "Plugin config sections, one per plugin section name."
    return dataclasses.make_dataclass(
        "GraftConfig",
        [("features", features, dataclasses.field(default_factory=features))],
        bases=(GraftConfig,),
    )
