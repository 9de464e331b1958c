"""`auto` settings: the measured fastest path on the device the run got, resolved once.

``rollout.decode=auto``, ``engine.max_tokens_per_row=null`` and ``engine.compile=null`` mean "what
is fastest here". On CUDA that is the tuned row of ``bench/README.md`` (its measured rollout and
update throughput against the old defaults): the static decode copy (its default
``rollout.decode_compile=cudagraphs``: graft-graphed-decode's loop where installed, its step
fused by inductor by default), packed rows of at most 2048 tokens, no compiled decoder blocks.
On CPU: the dynamic decode, one row per micro-batch, no compilation (what every run did before
`auto`).

`resolve_auto` runs where the device is known (`graft.training.trainer.Trainer`, after the
process group is up); everything built after it (engine, rollout, plugins' hooks) reads concrete
values. The run's config.yaml keeps the values as written and `describe_choices` says what
`auto` chose.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from graft.config.hooks import PluginManager, each_result, plugin_manager
from graft.errors import ConfigError

AUTO = "auto"

# setting -> (value on CUDA, value elsewhere)
CHOICES: dict[str, tuple[Any, Any]] = {
    "rollout.decode": ("static", "dynamic"),
    "engine.max_tokens_per_row": (2048, 0),
    "engine.compile": (False, False),
}


@dataclass(frozen=True)
class AutoChoice:
    """One setting left to `auto` and the value it got on ``device`` (``pinned_by``: the plugin
    whose `graft_auto_settings` chose it instead of the device's default)."""

    key: str
    value: Any
    device: str
    pinned_by: str | None = None

    def __str__(self) -> str:
        shown = str(self.value).lower() if isinstance(self.value, bool) else self.value
        by = f", for the plugin {self.pinned_by}" if self.pinned_by else ""
        return f"{self.key}: auto ({shown}{by})"


def is_auto(value: Any) -> bool:
    """True for the two spellings of `auto`: the string (choice fields) and null (numbers and
    booleans, which cannot hold a string)."""
    return value is None or value == AUTO


def resolve_auto(cfg: Any, device_type: str,
                 manager: PluginManager | None = None) -> tuple[Any, list[AutoChoice]]:
    """``cfg`` with every `auto` setting of `CHOICES` replaced by its value for ``device_type``
    (``cuda``, ``cpu``...), or by the value a plugin pins (`graft_auto_settings`), and the
    choices made (the settings given explicitly are kept)."""
    pins = plugin_pins(cfg, device_type, plugin_manager(manager))
    chosen = []
    for key, (on_cuda, elsewhere) in CHOICES.items():
        section, name = key.split(".")
        if is_auto(getattr(getattr(cfg, section), name)):
            plugin, value = pins.get(key, (None, on_cuda if device_type == "cuda" else elsewhere))
            cfg = _replace(cfg, section, name, value)
            chosen.append(AutoChoice(key, value, device_type, pinned_by=plugin))
    return cfg, chosen


def plugin_pins(cfg: Any, device_type: str,
                manager: PluginManager) -> dict[str, tuple[str, Any]]:
    """``{key: (plugin, value)}`` from every plugin's `graft_auto_settings`; a key that is no
    `auto` setting, or two plugins pinning one key to different values, is a `ConfigError`."""
    pins: dict[str, tuple[str, Any]] = {}
    for plugin, settings in each_result(manager, "graft_auto_settings", cfg=cfg,
                                        device_type=device_type):
        for key, value in (settings or {}).items():
            if key not in CHOICES:
                raise ConfigError(f"plugin {plugin!r}: graft_auto_settings pins {key!r}, "
                                  f"which is no auto setting (those are {', '.join(CHOICES)})")
            if key in pins and pins[key][1] != value:
                raise ConfigError(f"plugins {pins[key][0]!r} and {plugin!r} need {key} "
                                  f"= {pins[key][1]!r} and {value!r}; set {key} explicitly")
            pins[key] = (plugin, value)
    return pins


def _replace(cfg: Any, section: str, name: str, value: Any) -> Any:
    updated = dataclasses.replace(getattr(cfg, section), **{name: value})
    return dataclasses.replace(cfg, **{section: updated})


def describe_choices(choices: list[AutoChoice]) -> str:
    """``auto settings on cuda: rollout.decode: auto (static), ...``, or an empty string."""
    if not choices:
        return ""
    return f"auto settings on {choices[0].device}: {', '.join(map(str, choices))}"


def choices_comment(choices: list[AutoChoice]) -> str:
    """YAML comment lines recording the choices (appended to the run's config.yaml, which
    stays loadable with ``--config`` and comparable for resuming)."""
    if not choices:
        return ""
    lines = [f"# resolved on {choices[0].device} (graft.config.auto):"]
    lines += [f"#   {choice}" for choice in choices]
    return "\n".join(lines) + "\n"
