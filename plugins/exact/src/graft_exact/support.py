"""What ``features.exact.enabled`` cannot serve, as `ConfigError`s that say so and how to proceed.

The exact attention (`graft_exact.attention`) attends every query to one contiguous range of
keys with softmax weights: a sliding window is such a range (the trainer's mask and the
decode's sliding cache hold the same keys in the same order), and an attention sink (GPT-OSS)
only enlarges the softmax's normaliser, but sparse indexers (DeepSeek-V4) and linear attention
compute something else, and a model family can refuse for a reason of its own
(``ModelFamily.extras["exact"]["unsupported"]``). The rollout
must be the embedded engine (a separate engine computes with its own kernels), and nothing may
compile the model's forward or decode step (inductor would fuse the exact kernels into kernels
of its own order).
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

from graft.config import was_set
from graft.errors import ConfigError
from graft_exact.config import exact_enabled

ON = "features.exact.enabled=true"
OFF = "set features.exact.enabled=false"
# graft-graphed-decode's inductor-fused decode step (its section exists where it is installed)
FUSED_DECODE = "features.graphed_decode.fuse_kernels"


ATTENTION_LAYERS = ("full_attention", "sliding_attention")


def check_exact_support(config: Any, family: Any = None) -> None:
    """Raise `ConfigError` when the exact kernels cannot serve a model of ``config`` (a
    transformers config) of ``family`` (a `graft.models.ModelFamily`, optional)."""
    model_type = getattr(config, "model_type", "?")
    reason = (getattr(family, "extras", None) or {}).get("exact", {}).get("unsupported")
    if reason:
        raise ConfigError(f"{ON} cannot serve model_type {model_type!r}: {reason}; {OFF}")
    layer_types = getattr(config, "layer_types", None) or ()
    other = sorted({kind for kind in layer_types if kind not in ATTENTION_LAYERS})
    if other:
        raise ConfigError(f"{ON} cannot serve model_type {model_type!r}: its {', '.join(other)} "
                          f"layers compute no softmax attention over a range of keys, the "
                          f"one thing the exact attention computes; {OFF}")


def check_exact_settings(cfg: Any) -> None:
    """Raise `ConfigError` for settings ``features.exact.enabled=true`` cannot combine with."""
    if not exact_enabled(cfg):
        return
    if cfg.rollout.engine != "embedded":
        raise ConfigError(f"{ON} needs rollout.engine=embedded (the trained model's own "
                          f"kernels); {cfg.rollout.engine!r} samples with kernels of its own")
    if cfg.rollout.decode_compile == "inductor":
        raise ConfigError(f"{ON} cannot take rollout.decode_compile=inductor (inductor fuses its "
                          f"own kernels); use cudagraphs (the default) or none")
    if getattr(_graphed_decode(cfg), "fuse_kernels", False):
        raise ConfigError(f"{ON} cannot take {FUSED_DECODE}=true (inductor fuses its own "
                          f"kernels into the decode step); leave it unset or false")
    if cfg.engine.compile:
        raise ConfigError(f"{ON} cannot take engine.compile=true (compiled blocks fuse their own "
                          f"kernels); leave engine.compile unset")


def unfused_decode_by_default(cfg: Any, user_keys: Collection[str]) -> None:
    """``features.exact.enabled=true`` turns the default ``features.graphed_decode.fuse_kernels``
    off (where graft-graphed-decode is installed); a true the user set is refused by
    `check_exact_settings`."""
    section = _graphed_decode(cfg)
    if exact_enabled(cfg) and section is not None and not was_set(FUSED_DECODE, user_keys):
        section.fuse_kernels = False


def _graphed_decode(cfg: Any) -> Any:
    """``cfg.features.graphed_decode``, or None without graft-graphed-decode."""
    return getattr(getattr(cfg, "features", None), "graphed_decode", None)


def exact_needs_what_it_can_serve(cfg: Any, manager: Any) -> None:
    """The settings, model and family ``features.exact.enabled=true`` runs with, refused before
    any rank starts (a ``model.path`` not on this machine is checked when the model is built,
    `graft_exact.install.install_exact_kernels`)."""
    if not exact_enabled(cfg):
        return
    check_exact_settings(cfg)
    if cfg.model.path and not (Path(cfg.model.path).expanduser() / "config.json").is_file():
        return
    from graft.models import resolve_config

    config, family = resolve_config(cfg.model, manager)
    check_exact_support(config, family)
