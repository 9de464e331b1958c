"""Resolving dotted config keys against the schema, with errors that say what the user meant.

Hydra and OmegaConf reject an unknown key in a dataclass node, but accept ``+section.newkey=...``
and say little about the right spelling. Every key the user writes (command line or YAML) goes
through `check_key` first, whatever its prefix, after `check_moved` (keys that moved elsewhere,
`MOVED_KEYS`).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from graft.errors import ConfigError, did_you_mean


@dataclass(frozen=True)
class MovedKey:
    """Where a config key that left its section went: ``new`` (a dotted key), ``default`` (the
    old key's default: a config.yaml saved by an earlier version lists it, asking for nothing),
    ``provider`` (the distribution that now holds the key, when it left the core)."""

    new: str
    default: Any
    provider: str = ""


# Old dotted key -> where it went. The core lists what left it; a plugin that moves one of its
# own keys adds it with `register_moved_key` (from its plugin module).
MOVED_KEYS: dict[str, MovedKey] = {
    "engine.mlp_chunk_tokens": MovedKey("features.activation_memory.mlp_chunk_tokens", 0,
                                        "graft-activation-memory"),
    "engine.recompute_norms": MovedKey("features.activation_memory.recompute_norms", False,
                                       "graft-activation-memory"),
    "rollout.gpu_memory_utilization": MovedKey("features.vllm.gpu_memory_utilization", 0.3,
                                               "graft-vllm"),
    "rollout.max_model_len": MovedKey("features.vllm.max_model_len", 1024, "graft-vllm"),
    "export.delta": MovedKey("features.vllm.delta", False, "graft-vllm"),
    "rollout.exact": MovedKey("features.exact.enabled", False, "graft-exact"),
    "rollout.decode_fuse_kernels": MovedKey("features.graphed_decode.fuse_kernels", True,
                                            "graft-graphed-decode"),
    "rollout.environment": MovedKey("features.multiturn.environment", "none", "graft-multiturn"),
    "rollout.max_turns": MovedKey("features.multiturn.max_turns", 4, "graft-multiturn"),
    "rollout.max_episode_tokens": MovedKey("features.multiturn.max_episode_tokens", 256,
                                           "graft-multiturn"),
    "rollout.env_timeout_s": MovedKey("features.multiturn.env_timeout_s", 10.0, "graft-multiturn"),
    "rollout.max_failed_env_steps": MovedKey("features.multiturn.max_failed_env_steps", 3,
                                             "graft-multiturn"),
    "algorithm.reward_workers": MovedKey("features.reward_pool.workers", 4, "graft-reward-pool"),
    "algorithm.reward_pool": MovedKey("features.reward_pool.kind", "auto", "graft-reward-pool"),
    "algorithm.reward_timeout_s": MovedKey("features.reward_pool.timeout_s", 10.0,
                                           "graft-reward-pool"),
    "algorithm.dynamic_sampling": MovedKey("features.dapo.dynamic_sampling", False, "graft-dapo"),
    "algorithm.max_sampling_rounds": MovedKey("features.dapo.max_sampling_rounds", 4,
                                              "graft-dapo"),
    "algorithm.overlong": MovedKey("features.dapo.overlong", "none", "graft-dapo"),
    "algorithm.overlong_buffer": MovedKey("features.dapo.overlong_buffer", None, "graft-dapo"),
    "algorithm.overlong_penalty": MovedKey("features.dapo.overlong_penalty", 1.0, "graft-dapo"),
    "loss.gspo_rollout_is": MovedKey("features.gspo.rollout_is", "none", "graft-gspo"),
    "loss.gspo_rollout_is_cap": MovedKey("features.gspo.rollout_is_cap", 2.0, "graft-gspo"),
    "trainer.tensorboard": MovedKey("features.tensorboard.enabled", False, "graft-tensorboard"),
}


def register_moved_key(old: str, new: str, *, default: Any, provider: str = "") -> None:
    """Make the dotted key ``old`` a `ConfigError` naming ``new`` (see `MovedKey`); for a
    plugin that renames or moves one of its keys, called when its plugin module is imported."""
    MOVED_KEYS[old] = MovedKey(new, default, provider)


def check_moved(dotted: str, value: Any, *, source: str) -> bool:
    """`ConfigError` naming the new key when ``dotted`` is a key of `MOVED_KEYS` set to anything
    but its old default; True when it is set to that default (the caller drops it: earlier
    versions saved every key with the run), False for a key that did not move."""
    moved = MOVED_KEYS.get(dotted)
    if moved is None:
        return False
    if value == moved.default:
        return True
    provider = f" (installed with {moved.provider})" if moved.provider else ""
    raise ConfigError(f"config key {dotted!r} ({source}) moved: set {moved.new!r}{provider} "
                      f"instead")


def was_set(key: str, user_keys: Collection[str]) -> bool:
    """True when the user gave ``key`` (dotted) a value in a config file or an override, itself
    or through a section above it; False when it holds the schema's default. ``user_keys`` is
    what a ``graft_config_rules`` rule declaring it receives."""
    return key in user_keys or any(key.startswith(f"{k}.") for k in user_keys)

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
    """A readable name for a schema type: ``int``, ``float or null``, ``list of float``,
    ``mapping``, ``a section (mapping)``, ``any``."""
    if dataclasses.is_dataclass(tp):
        return "a section (mapping)"
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if arg is type(None) else describe_type(arg)
                           for arg in typing.get_args(tp))
    if tp is Any:
        return "any"
    if origin in (list, tuple):
        inner = typing.get_args(tp)
        return f"list of {describe_type(inner[0])}" if inner else "list"
    if origin is dict:
        return "mapping"
    return getattr(tp, "__name__", str(tp))
