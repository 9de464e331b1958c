"""What ``rollout.exact`` cannot serve, as `ConfigError`s that say so and how to proceed.

The exact attention (`graft.engine.exact.attention`) attends every query to one contiguous range
of keys with plain softmax weights: sliding-window layers, attention sinks and sparse indexers
(DeepSeek-V4) compute something else, and a family can refuse for a reason of its own
(``ModelFamily.exact_unsupported``). The rollout must be the embedded engine (a separate engine
computes with its own kernels), and nothing may compile the model's forward (inductor would
fuse the exact kernels into kernels of its own order).
"""

from __future__ import annotations

from typing import Any

from graft.errors import ConfigError


def check_exact_support(config: Any, family: Any = None) -> None:
    """Raise `ConfigError` when the exact kernels cannot serve a model of ``config`` (a
    transformers config) of ``family`` (a `graft.models.family.ModelFamily`, optional)."""
    model_type = getattr(config, "model_type", "?")
    reason = getattr(family, "exact_unsupported", None)
    if reason:
        raise ConfigError(f"rollout.exact=true cannot serve model_type {model_type!r}: {reason}; "
                          f"set rollout.exact=false")
    layer_types = getattr(config, "layer_types", None) or ()
    windowed = [kind for kind in layer_types if kind != "full_attention"]
    sliding = getattr(config, "sliding_window", None) is not None and \
        getattr(config, "use_sliding_window", True) is not False and not layer_types
    if windowed or sliding:
        kinds = ", ".join(sorted(set(windowed))) or "sliding_window"
        raise ConfigError(f"rollout.exact=true cannot serve model_type {model_type!r}: its "
                          f"attention layers ({kinds}) do not attend the whole causal context, "
                          f"and the exact attention serves only full causal attention; set "
                          f"rollout.exact=false")


def check_exact_settings(cfg: Any) -> None:
    """Raise `ConfigError` for settings ``rollout.exact=true`` cannot combine with."""
    if not cfg.rollout.exact:
        return
    if cfg.rollout.engine != "embedded":
        raise ConfigError(f"rollout.exact=true needs rollout.engine=embedded (the trained "
                          f"model's own kernels); {cfg.rollout.engine!r} samples with kernels "
                          f"of its own")
    if cfg.rollout.decode_compile == "inductor":
        raise ConfigError("rollout.exact=true cannot take rollout.decode_compile=inductor "
                          "(inductor fuses its own kernels); use cudagraphs (the default) or "
                          "none")
    if cfg.engine.compile:
        raise ConfigError("rollout.exact=true cannot take engine.compile=true (compiled blocks "
                          "fuse their own kernels); leave engine.compile unset")
