"""Composing the config: schema (core + plugin sections) <- YAML files <- command-line overrides."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from graft.config.hooks import PluginManager, plugin_manager
from graft.config.presets import resolve_config_file
from graft.config.ranges import check_ranges
from graft.config.registries import registry_hint, registry_names
from graft.config.sections import build_root_schema
from graft.config.sources import apply_overrides, apply_yaml_file
from graft.errors import ConfigError, did_you_mean


def schema_config(manager: PluginManager | None = None) -> tuple[type, DictConfig]:
    """The root schema class and its default config (struct mode) for the loaded plugins."""
    manager = plugin_manager(manager)
    schema = build_root_schema({n: s.schema for n, s in manager.config_sections.items()})
    cfg = OmegaConf.structured(schema)
    OmegaConf.set_struct(cfg, True)
    return schema, cfg


def compose(overrides: Sequence[str] = (), config_files: Sequence[str | Path] = (), *,
            manager: PluginManager | None = None) -> Any:
    """Compose and validate the run config; return the root dataclass instance.

    ``config_files`` are YAML files or preset names, merged in order; ``overrides`` are Hydra
    override strings applied last. Raises `ConfigError` naming the offending key.
    """
    manager = plugin_manager(manager)
    schema, cfg = schema_config(manager)
    hint = plugin_hint(manager)
    user_keys: set[str] = set()  # what the files and overrides set, as opposed to the defaults
    for item in config_files:
        apply_yaml_file(cfg, schema, resolve_config_file(item, manager), plugin_hint=hint,
                        set_keys=user_keys)
    apply_overrides(cfg, schema, overrides, plugin_hint=hint, set_keys=user_keys)
    return to_validated_object(cfg, manager, user_keys=user_keys)


def to_validated_object(cfg: DictConfig, manager: PluginManager, *,
                        user_keys: Collection[str] = ()) -> Any:
    """Turn a composed DictConfig into dataclasses; check every `choice` field and every
    `bounded` field's range; fit the defaults of keys not in ``user_keys`` (the dotted keys the
    user set) to the other settings, then check the rules that tie fields together
    (`graft.config.validate`)."""
    from graft.config.validate import adjust_defaults, validate_config

    try:
        obj = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"invalid config at {getattr(exc, 'full_key', '?')!r}: {exc}") from exc
    except (ValueError, TypeError) as exc:  # raised by a section's __post_init__
        raise ConfigError(f"invalid config: {exc}") from exc
    check_choices(obj, manager)
    check_ranges(obj)
    adjust_defaults(obj, manager, user_keys)
    validate_config(obj, manager)
    return obj


def valid_choices(f: dataclasses.Field, manager: PluginManager) -> list[str] | None:
    """The values a `choice` field accepts (its fixed choices, then its registry's names), or
    None for a field that is not a choice."""
    if "choices" not in f.metadata:
        return None
    valid = list(f.metadata["choices"])
    registry = f.metadata.get("registry")
    if registry:
        valid += [name for name in registry_names(registry, manager) if name not in valid]
    return valid


def check_choices(obj: Any, manager: PluginManager, prefix: str = "") -> None:
    """Raise `ConfigError` for a field whose value is not among its declared choices, with a
    "did you mean" and the valid values."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        dotted = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            check_choices(value, manager, dotted + ".")
            continue
        valid = valid_choices(f, manager)
        if valid is None or value in valid:
            continue
        message = (f"config key {dotted!r} is {value!r}.{did_you_mean(str(value), valid)} "
                   f"Valid values: {', '.join(valid)}.")
        if f.metadata.get("registry"):
            message += registry_hint(f.metadata["registry"], manager)
        raise ConfigError(message)


def to_yaml(obj: Any) -> str:
    """The config as YAML (what ``graft config show`` prints and runs save as config.yaml)."""
    return OmegaConf.to_yaml(OmegaConf.structured(obj))


def plugin_hint(manager: PluginManager) -> str:
    """A sentence about plugins that are installed but not loaded, for unknown-section errors."""
    inactive = [f"{r.name} ({r.status})" for r in manager.records.values()
                if r.status in ("disabled", "failed")]
    loaded = ", ".join(manager.loaded_names()) or "none loaded"
    text = f" Sections come from loaded plugins ({loaded})."
    if inactive:
        text += f" Installed but not loaded: {', '.join(inactive)} (see `graft plugins`)."
    return text
