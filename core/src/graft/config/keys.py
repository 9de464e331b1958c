"""Resolving dotted config keys against the schema, with errors that say what the user meant.

Hydra and OmegaConf reject an unknown key in a dataclass node, but accept ``+section.newkey=...``
and say little about the right spelling. Every key the user writes (command line or YAML) goes
through `check_key` first, whatever its prefix.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from graft.errors import ConfigError, did_you_mean


def is_open_mapping(node: Any) -> bool:
    """True for a ``Dict[...]`` field: any key is allowed below it."""
    return isinstance(node, DictConfig) and not dataclasses.is_dataclass(OmegaConf.get_type(node))


def check_key(cfg: DictConfig, dotted: str, *, source: str, plugin_hint: str = "") -> bool:
    """Raise `ConfigError` unless ``dotted`` names a key of the schema ``cfg``.

    Returns True when the key lies inside an open mapping (it may be new there). ``source``
    says where the key came from (``the command line``, a file and line) for the message;
    ``plugin_hint`` is appended when the unknown key is a ``features`` section.
    """
    node: Any = cfg
    parts = dotted.split(".")
    for depth, part in enumerate(parts):
        if is_open_mapping(node):
            return True
        section = ".".join(parts[:depth]) or "the root config"
        if isinstance(node, ListConfig) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
            continue
        if not isinstance(node, DictConfig):
            raise ConfigError(
                f"unknown config key {dotted!r} ({source}): {section} is a value, not a section, "
                f"so it has no key {part!r}"
            )
        if part not in node:
            raise ConfigError(_unknown_key_message(cfg, dotted, part, node, section, source,
                                                   plugin_hint if section == "features" else ""))
        node = node._get_node(part)
    return False


def _unknown_key_message(cfg: DictConfig, dotted: str, part: str, node: DictConfig,
                         section: str, source: str, plugin_hint: str) -> str:
    valid = [str(k) for k in node.keys()]
    message = (f"unknown config key {dotted!r} ({source}): {section} has no key {part!r}."
               f"{did_you_mean(part, valid)}")
    elsewhere = [path for path in iter_key_paths(cfg) if path.rsplit(".", 1)[-1] == part]
    if elsewhere:
        message += f" A key {part!r} exists at: {', '.join(elsewhere[:3])}."
    message += f" Valid keys in {section}: {', '.join(valid) or '(none)'}."
    return message + plugin_hint


def iter_key_paths(node: Any, prefix: str = "") -> Iterator[str]:
    """Yield every dotted key path of a config (sections and leaves)."""
    if not isinstance(node, DictConfig) or is_open_mapping(node):
        return
    for key in node.keys():
        path = f"{prefix}{key}"
        yield path
        yield from iter_key_paths(node._get_node(key), path + ".")


def field_type(schema: type, dotted: str) -> Any:
    """The annotated type of the dataclass field at ``dotted`` (Any when below an open mapping)."""
    current: Any = schema
    for part in dotted.split("."):
        if not dataclasses.is_dataclass(current):
            return Any
        hints = typing.get_type_hints(current)
        if part not in hints:
            return Any
        current = _strip_optional(hints[part])
    return current


def _strip_optional(tp: Any) -> Any:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) is typing.Union and len(args) == 1:
        return args[0]
    return tp


def describe_type(tp: Any) -> str:
    """A readable name for a schema type: ``int``, ``list of float``, ``mapping``, ``section``."""
    if dataclasses.is_dataclass(tp):
        return "a section (mapping)"
    origin = typing.get_origin(tp)
    if origin in (list, tuple):
        inner = typing.get_args(tp)
        return f"list of {describe_type(inner[0])}" if inner else "list"
    if origin is dict:
        return "mapping"
    return getattr(tp, "__name__", str(tp))
