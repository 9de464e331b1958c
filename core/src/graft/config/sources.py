"""Applying user input to the schema: YAML files and command-line overrides (Hydra's grammar).

Each key is checked with `graft.config.keys.check_key` before OmegaConf sees it; OmegaConf's
type errors are rewritten to name the key, the expected type and the value.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from graft.config.keys import check_key, check_moved, describe_type, field_type, is_open_mapping
from graft.errors import ConfigError

COMMAND_LINE = "the command line"


def apply_yaml_file(cfg: DictConfig, schema: type, path: Path, *, plugin_hint: str = "",
                    set_keys: set[str] | None = None) -> None:
    """Merge the YAML file ``path`` into ``cfg`` after checking every key it contains; add the
    dotted keys it sets (leaves) to ``set_keys``."""
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    text = path.read_text()
    try:
        data = yaml.safe_load(text)
        lines = key_lines(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {exc}") from exc
    if data is None:
        return
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of sections, "
                          f"got {type(data).__name__}")

    def source(dotted: str) -> str:
        line = lines.get(dotted)
        return f"{path}, line {line}" if line else str(path)

    _check_mapping(cfg, data, "", source, plugin_hint)
    _merge(cfg, schema, OmegaConf.create(data), source)
    if set_keys is not None:
        set_keys.update(leaf_keys(data))


def leaf_keys(value: Any, prefix: str = "") -> list[str]:
    """The dotted keys of the leaves of ``value`` under ``prefix`` (``{"a": {"b": 1}}`` ->
    ``["a.b"]``): the keys a YAML file or an override gives a value, unlike those it leaves at
    their default."""
    if isinstance(value, dict) and value:
        return [key for name, item in value.items()
                for key in leaf_keys(item, f"{prefix}.{name}" if prefix else str(name))]
    return [prefix] if prefix else []


def _check_mapping(cfg: DictConfig, data: dict[Any, Any], prefix: str,
                   source: Callable[[str], str], plugin_hint: str) -> None:
    for key, value in list(data.items()):
        dotted = f"{prefix}{key}"
        if check_moved(dotted, value, source=source(dotted)):
            del data[key]  # a moved key at its old default (a config.yaml of an earlier version)
            continue
        if check_key(cfg, dotted, source=source(dotted), plugin_hint=plugin_hint):
            continue
        node = OmegaConf.select(cfg, dotted, default=None)
        if isinstance(node, DictConfig) and not is_open_mapping(node):
            if isinstance(value, dict):
                _check_mapping(cfg, value, dotted + ".", source, plugin_hint)
            elif value is not None:
                raise ConfigError(f"config key {dotted!r} ({source(dotted)}) is a section; give "
                                  f"a mapping of its keys, not {value!r}")


def _merge(cfg: DictConfig, schema: type, update: DictConfig,
           source: Callable[[str], str]) -> None:
    try:
        cfg.merge_with(update)
    except OmegaConfBaseException as exc:
        raise type_error(schema, exc, source) from exc


def apply_overrides(cfg: DictConfig, schema: type, overrides: Sequence[str], *,
                    plugin_hint: str = "", set_keys: set[str] | None = None) -> None:
    """Apply Hydra-style overrides (``a.b=1``, ``+a.b=1``, ``++a.b=1``, ``~a.b``) to ``cfg``;
    add the dotted keys they set to ``set_keys``.

    ``+`` does not let a key into a dataclass section (unlike plain Hydra): unknown keys are an
    error whatever the prefix. New keys are welcome only inside open mappings
    (``model.overrides``), and ``~`` deletes only there.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for text in overrides:
        try:
            override = parser.parse_overrides([text])[0]
        except HydraException as exc:
            raise ConfigError(f"cannot parse the override {text!r}: {exc}. Write key=value, "
                              f"e.g. trainer.total_steps=3") from exc
        if override.is_sweep_override():
            raise ConfigError(f"the override {text!r} is a sweep; Graft runs one config at a time "
                              f"(quote a list value: key=[a,b])")
        key = override.key_or_group
        if check_moved(key, override.value(), source=COMMAND_LINE):
            continue
        in_open_mapping = check_key(cfg, key, source=COMMAND_LINE, plugin_hint=plugin_hint)
        if override.type == OverrideType.DEL:
            _delete(cfg, key, in_open_mapping)
            continue
        _set(cfg, schema, key, override.value(), in_open_mapping)
        if set_keys is not None:
            set_keys.update(leaf_keys(override.value(), key))


def _set(cfg: DictConfig, schema: type, key: str, value: Any, in_open_mapping: bool) -> None:
    try:
        if in_open_mapping:
            with open_dict(cfg):
                OmegaConf.update(cfg, key, value, merge=True)
        else:
            OmegaConf.update(cfg, key, value, merge=True)
    except OmegaConfBaseException as exc:
        raise type_error(schema, exc, lambda _: COMMAND_LINE, key=key, value=value) from exc


def _delete(cfg: DictConfig, key: str, in_open_mapping: bool) -> None:
    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
    if not in_open_mapping or not isinstance(parent, DictConfig) or leaf not in parent:
        raise ConfigError(f"cannot delete {key!r}: only keys inside an open mapping (such as "
                          f"model.overrides) can be deleted; set a schema key to a value instead")
    with open_dict(parent):
        del parent[leaf]


def type_error(schema: type, exc: OmegaConfBaseException, source: Callable[[str], str], *,
               key: str | None = None, value: Any = None) -> ConfigError:
    """Rewrite an OmegaConf validation error as: key, expected type, value, where it came from."""
    full_key = str(getattr(exc, "full_key", None) or key or "")
    if value is None and key is None:
        value = getattr(exc, "value", None)
    expected = describe_type(field_type(schema, full_key)) if full_key else "?"
    shown = f"{value!r} ({type(value).__name__})" if value is not None else "the given value"
    reason = str(getattr(exc, "msg", exc)).splitlines()[0]
    return ConfigError(f"config key {full_key!r} ({source(full_key)}) expects {expected}, "
                       f"got {shown}: {reason}")


def key_lines(text: str) -> dict[str, int]:
    """Map each dotted key of a YAML document to its 1-based line number."""
    root = yaml.compose(text)
    lines: dict[str, int] = {}

    def walk(node: Any, prefix: str) -> None:
        if not isinstance(node, yaml.MappingNode):
            return
        for key_node, value_node in node.value:
            dotted = f"{prefix}{key_node.value}"
            lines[dotted] = key_node.start_mark.line + 1
            walk(value_node, dotted + ".")

    walk(root, "")
    return lines
