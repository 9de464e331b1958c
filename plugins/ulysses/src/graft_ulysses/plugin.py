"""The plugin's table of contents: every point where graft-ulysses touches Graft's core, in
the order of a run. With ``features.ulysses.sp_size=1`` (the default) every hook is a no-op:
the model keeps its own attention and nothing is split.
"""

from __future__ import annotations

from typing import Any

from graft import hookimpl
from graft_ulysses.config import UlyssesConfig, run_conflict, sp_size


@hookimpl
def graft_config_sections() -> list[tuple[str, type]]:
    """``features.ulysses`` (``sp_size``)."""
    return [("ulysses", UlyssesConfig)]


@hookimpl
def graft_parallel_dims(cfg: Any) -> dict[str, int] | None:
    """The sp mesh dimension: ``sp_size`` ranks split every row (checked against the world
    size by the core, against the settings here)."""
    size = sp_size(cfg)
    if size == 1:
        return None
    if (conflict := run_conflict(cfg)) is not None:
        from graft.errors import ConfigError

        raise ConfigError(conflict)
    return {"sp": size}


@hookimpl
def graft_pre_shard(model: Any, cfg: Any) -> None:
    """Check the model can be served, then register Ulysses around its attention (the policy
    and the reference: both run split forwards)."""
    size = sp_size(cfg)
    if size == 1:
        return
    from graft.models import family_for
    from graft_ulysses.attention import install
    from graft_ulysses.checks import (
        check_attention,
        check_family,
        check_full_attention,
        check_heads,
    )

    check_family(family_for(model.config.model_type), size)
    check_heads(model.config, size)
    check_full_attention(model.config, size)
    check_attention(model.config, size)
    install(model)


@hookimpl
def graft_inference_copy(model: Any) -> None:
    """A rollout engine's plain copy of the policy generates on whole sequences: it gets the
    original attention back (its config was copied from the policy's)."""
    from graft_ulysses.attention import uninstall

    uninstall(model)


@hookimpl
def graft_step_end(metrics: dict[str, float]) -> None:
    """``ulysses/all_to_all_gb``: what this rank's all-to-alls sent during the step (forward,
    backward and recomputation; absent when nothing was split)."""
    from graft_ulysses.all_to_all import take_bytes

    if sent := take_bytes():
        metrics["ulysses/all_to_all_gb"] = sent / 2**30
