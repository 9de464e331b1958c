"""The plugin's table of contents: every point where graft-exact touches Graft's core, in the
order of a run. Every hook is a no-op while ``features.exact.enabled`` is false.
"""

from __future__ import annotations

import weakref
from collections.abc import Generator
from typing import Any

from graft import hookimpl
from graft_exact.config import ExactConfig, exact_enabled

# The static decode copies given the kernels (`graft_inference_copy`), held weakly.
_COPIES_WITH_KERNELS: weakref.WeakSet[Any] = weakref.WeakSet()


@hookimpl
def graft_config_sections() -> list[tuple[str, type]]:
    """``features.exact`` (``enabled``)."""
    return [("exact", ExactConfig)]


@hookimpl
def graft_config_rules() -> list[Any]:
    """The default ``features.graphed_decode.fuse_kernels`` off (graft-graphed-decode's fused
    decode step); what the kernels cannot serve refused."""
    from graft_exact.support import exact_needs_what_it_can_serve, unfused_decode_by_default

    return [unfused_decode_by_default, exact_needs_what_it_can_serve]


@hookimpl
def graft_auto_settings(cfg: Any) -> dict[str, Any] | None:
    """``engine.compile`` left to `auto` stays off: compiled blocks fuse their own kernels."""
    return {"engine.compile": False} if exact_enabled(cfg) else None


@hookimpl
def graft_pre_shard(model: Any, cfg: Any) -> None:
    """The exact attention, experts, norms and rotary embedding on the model (the policy and
    the frozen reference: both compute the log-probs the rollout's are compared with)."""
    if exact_enabled(cfg):
        _install(model)


@hookimpl
def graft_inference_copy(model: Any, cfg: Any) -> None:
    """The same kernels on the static decode's copy, once (the hook runs after every refresh).
    Whether the copy has them cannot be read from its config: copied from the policy's, it
    names the exact attention already, while the copy's norms are still its class's own."""
    if exact_enabled(cfg) and model not in _COPIES_WITH_KERNELS:
        _install(model)
        _COPIES_WITH_KERNELS.add(model)


@hookimpl(wrapper=True)
def graft_compute(step: str, cfg: Any) -> Generator[None, Any, Any]:
    """Every forward, backward and generation step inside the exact kernels' dispatch mode; the
    gradient the fused head takes in a forward with the ordinary kernels (it need not be
    batch-invariant: the log-probs it starts from are)."""
    if not exact_enabled(cfg):
        return (yield)
    from graft_exact.mode import exact_kernels, ordinary_kernels

    with ordinary_kernels() if step == "gradient" else exact_kernels():
        return (yield)


def _install(model: Any) -> None:
    from graft.models import family_for
    from graft_exact.install import install_exact_kernels

    install_exact_kernels(model, family_for(model.config.model_type))
