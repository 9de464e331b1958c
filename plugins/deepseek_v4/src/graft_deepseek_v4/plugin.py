"""The plugin's table of contents: every point where graft-deepseek-v4 touches Graft's core."""

from __future__ import annotations

from typing import Any

from graft import hookimpl
from graft_deepseek_v4.config import DeepseekV4Config


@hookimpl
def graft_config_sections() -> list[tuple[str, type]]:
    """``features.deepseek_v4``: QAT settings."""
    return [("deepseek_v4", DeepseekV4Config)]


@hookimpl
def graft_model_families() -> list[Any]:
    """The ``deepseek_v4`` family (preset ``tiny-deepseek-v4``)."""
    from graft_deepseek_v4.family import deepseek_v4_family

    return [deepseek_v4_family()]


@hookimpl
def graft_pre_shard(model: Any, cfg: Any, mesh: Any, role: str) -> None:
    """QAT's fake quantisation (``features.deepseek_v4.qat``) on the policy and the KL
    reference alike."""
    if cfg.features.deepseek_v4.qat != "none":
        from graft_deepseek_v4.install import install_qat

        install_qat(model, cfg, role, mesh)


@hookimpl
def graft_inference_copy(model: Any, trained: Any) -> None:
    """``rollout.decode=static``: the decode copy quantised like the policy (its weights after
    every refresh, its activations by the same hooks), so rollout samples the quantised policy."""
    from graft_deepseek_v4.install import mirror_qat

    mirror_qat(model, trained)


@hookimpl
def graft_step_end(step: int, metrics: dict[str, float]) -> None:
    """Masters back in place before checkpoints and export; ``deepseek_v4/qat_weight_passes``
    (weight quantisation passes this step: one per optimizer step)."""
    from graft_deepseek_v4.weights import step_metrics

    metrics.update(step_metrics())
