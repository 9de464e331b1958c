"""The plugin manager: loads discovered plugins with failure isolation and records what happened.

What a user sees (``graft plugins``) is the list of `PluginRecord` this module keeps: one per
discovered plugin, with its status (loaded / disabled / failed + error) and what it provides.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pluggy

from graft import hookspecs
from graft._version import __version__
from graft.errors import PluginError
from graft.plugins.discovery import (
    Candidate,
    check_names_exist,
    check_requirements,
    discover_candidates,
    missing_message,
)
from graft.plugins.registry import implementers_without, verify_registry_entries
from graft.plugins.tracing import TRACE_ENV, install_tracing
from graft.plugins.validation import verify_plugin

logger = logging.getLogger("graft.plugins")

PluginStatus = Literal["loaded", "disabled", "failed", "builtin"]

# Core modules that implement hooks themselves (the core uses its own API). They register before
# any plugin, so a plugin's implementation of a firstresult hook is asked first.
BUILTIN_PLUGINS: tuple[str, ...] = ("graft.losses.builtin", "graft.checkpoint.backfill",
                                    "graft.models.builtin", "graft.rl.builtin",
                                    "graft.export.builtin", "graft.rollout.builtin",
                                    "graft.training.builtin")


@dataclass
class ConfigSection:
    """A plugin's config section: merged into the schema at ``features.<name>``."""

    name: str
    schema: type
    plugin: str


@dataclass
class PluginRecord:
    """What happened to one plugin in this process."""

    name: str
    distribution: str
    version: str
    target: str
    status: PluginStatus
    error: str | None = None
    hooks: list[str] = field(default_factory=list)
    config_sections: list[str] = field(default_factory=list)
    import_seconds: float = 0.0
    # what is wrong around a loaded plugin (a dependency at a version it does not declare)
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``graft plugins --json``)."""
        return dataclasses.asdict(self)


class GraftPluginManager:
    """Loads Graft plugins into a pluggy manager and keeps a record of each one."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        self.records: dict[str, PluginRecord] = {}
        self.config_sections: dict[str, ConfigSection] = {}
        self._undo_tracing = install_tracing(self.pm) if os.environ.get(TRACE_ENV) else None

    @property
    def hook(self) -> pluggy.HookRelay:
        """The hook relay: ``manager.hook.graft_pre_shard(model=..., cfg=..., mesh=...)``."""
        return self.pm.hook

    def load(
        self,
        *,
        allowlist: Sequence[str] | None = None,
        disabled: Sequence[str] = (),
        candidates: Sequence[Candidate] | None = None,
        builtins: Sequence[str] = BUILTIN_PLUGINS,
    ) -> None:
        """Register the built-in plugins, then every discovered plugin the user allows.

        ``allowlist`` None loads all plugins, [] none; its names are explicit requests, so a
        missing or failing one raises `PluginError`. ``disabled`` names plugins to skip. An
        auto-discovered plugin that fails is recorded as failed and skipped.
        """
        for module_name in builtins:
            self._register_builtin(module_name)
        found = list(discover_candidates() if candidates is None else candidates)
        known = [c.name for c in found]
        check_names_exist(allowlist or (), known, source="GRAFT_PLUGINS")
        check_names_exist(disabled, known, source="--disable-plugin / GRAFT_DISABLE_PLUGINS")
        for candidate in found:
            explicit = allowlist is not None and candidate.name in allowlist
            if candidate.name in disabled or (allowlist is not None and not explicit):
                self.records[candidate.name] = _record(candidate, "disabled")
                continue
            self._load_candidate(candidate, explicit=explicit)
        self.pm.check_pending()
        self._warn_undeclared_agg_modes()

    def register(self, plugin: object, name: str, *, distribution: str = "<local>",
                 version: str = "", target: str = "") -> PluginRecord:
        """Verify and register ``plugin`` under ``name``; raise `PluginError` if it is broken.

        Used for entry-point plugins and by `graft.testing` to register a plugin temporarily.
        """
        if name in self.records and self.records[name].status in ("loaded", "builtin"):
            raise PluginError(f"a plugin named {name!r} is already registered")
        hooks = verify_plugin(plugin, name)
        self.pm.register(plugin, name=name)
        try:
            sections = self._collect_sections(plugin, name)
            verify_registry_entries(self, name)  # registry functions callable by keywords
        except Exception:
            self.pm.unregister(name=name)
            raise
        record = PluginRecord(name, distribution, version, target or _target_of(plugin),
                              "loaded", hooks=hooks, config_sections=[s.name for s in sections])
        for section in sections:
            self.config_sections[section.name] = section
        self.records[name] = record
        return record

    def unregister(self, name: str) -> None:
        """Remove a registered plugin and its config sections."""
        self.pm.unregister(name=name)
        self.records.pop(name, None)
        for section_name in [s.name for s in self.config_sections.values() if s.plugin == name]:
            del self.config_sections[section_name]

    def loaded_names(self) -> list[str]:
        """Names of the plugins whose hooks are active (built-ins included)."""
        return [r.name for r in self.records.values() if r.status in ("loaded", "builtin")]

    def _warn_undeclared_agg_modes(self) -> None:
        """A plugin whose loss modes config validation will reject is worth a word at load."""
        for name in implementers_without(self, "graft_loss_aggregate", "graft_loss_agg_modes"):
            logger.warning("plugin %r implements graft_loss_aggregate but declares no mode with "
                           "graft_loss_agg_modes, so loss.loss_agg_mode cannot select its modes",
                           name)

    def _register_builtin(self, module_name: str) -> None:
        record = self.register(importlib.import_module(module_name), module_name,
                               distribution="graft", version=__version__, target=module_name)
        record.status = "builtin"

    def _load_candidate(self, candidate: Candidate, *, explicit: bool) -> None:
        started = time.perf_counter()
        # A dependency a plugin imports lazily would fail only later, in a reward worker or a
        # step: its distribution's declared requirements are checked before it loads.
        requirements = check_requirements(candidate.entry_point.dist)
        try:
            if requirements.missing:
                raise _MissingDependency(missing_message(candidate, requirements.missing))
            plugin = candidate.entry_point.load()
            record = self.register(plugin, candidate.name, distribution=candidate.distribution,
                                   version=candidate.version, target=candidate.target)
        except Exception as exc:  # noqa: BLE001 - isolation: any failure of a plugin is recorded
            error = (str(exc) if isinstance(exc, _MissingDependency)
                     else f"{type(exc).__name__}: {exc}")
            if explicit:
                raise PluginError(
                    f"the plugin {candidate.name!r} (from {candidate.distribution} "
                    f"{candidate.version}), requested in GRAFT_PLUGINS, failed to load: {error}"
                ) from exc
            logger.warning("plugin %r (%s %s) failed to load and is skipped: %s",
                           candidate.name, candidate.distribution, candidate.version, error)
            record = _record(candidate, "failed", error=error)
        record.import_seconds = time.perf_counter() - started
        for mismatch in requirements.mismatched if record.status == "loaded" else ():
            record.warnings.append(f"{candidate.distribution} requires {mismatch}")
            logger.warning("plugin %r: %s requires %s", candidate.name, candidate.distribution,
                           mismatch)
        self.records[candidate.name] = record

    def _collect_sections(self, plugin: object, name: str) -> list[ConfigSection]:
        impl = getattr(plugin, "graft_config_sections", None)
        if impl is None or name not in [i.plugin_name for i in
                                        self.pm.hook.graft_config_sections.get_hookimpls()]:
            return []
        from graft.config.sections import validate_section  # omegaconf only when needed

        sections = []
        for item in impl() or []:
            section_name, schema = validate_section(item, plugin_name=name)
            owner = self.config_sections.get(section_name)
            if owner is not None or section_name in [s.name for s in sections]:
                raise PluginError(
                    f"plugins {owner.plugin if owner else name!r} and {name!r} both declare the "
                    f"config section features.{section_name}; rename one of them"
                )
            sections.append(ConfigSection(section_name, schema, name))
        return sections


class _MissingDependency(PluginError):
    """A plugin's distribution requires a distribution that is not installed."""


def _record(candidate: Candidate, status: PluginStatus, error: str | None = None) -> PluginRecord:
    return PluginRecord(candidate.name, candidate.distribution, candidate.version,
                        candidate.target, status, error=error)


def _target_of(plugin: object) -> str:
    return getattr(plugin, "__name__", None) or type(plugin).__qualname__
