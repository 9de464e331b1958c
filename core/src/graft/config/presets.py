"""Presets: YAML configs shipped inside graft and inside plugins (a ``presets/`` folder next to the
plugin's top-level package ``__init__.py``), selected by name with ``--config NAME``."""

from __future__ import annotations

import sys
from pathlib import Path

from graft.config.hooks import PluginManager
from graft.errors import ConfigError, did_you_mean

CORE_PRESETS = Path(__file__).resolve().parent.parent / "presets"


def preset_dirs(manager: PluginManager) -> list[Path]:
    """Preset folders of graft and of every loaded plugin, in that order."""
    dirs = [CORE_PRESETS]
    for record in manager.records.values():
        if record.status != "loaded":
            continue
        package = sys.modules.get(record.target.split(":")[0].split(".")[0])
        package_file = getattr(package, "__file__", None)
        if package_file:
            candidate = Path(package_file).resolve().parent / "presets"
            if candidate.is_dir() and candidate not in dirs:
                dirs.append(candidate)
    return dirs


def available_presets(manager: PluginManager) -> dict[str, Path]:
    """Preset name -> file, for every preset folder (the first folder wins a name clash)."""
    found: dict[str, Path] = {}
    for folder in preset_dirs(manager):
        for path in sorted(folder.glob("*.yaml")):
            found.setdefault(path.stem, path)
    return found


def resolve_config_file(item: str | Path, manager: PluginManager) -> Path:
    """A config file path as given, or the file of the preset named ``item``."""
    path = Path(item)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist")
        return path
    presets = available_presets(manager)
    if str(item) in presets:
        return presets[str(item)]
    raise ConfigError(f"{str(item)!r} is neither a YAML file nor a preset."
                      f"{did_you_mean(str(item), presets)} Presets: {', '.join(presets) or 'none'}.")
