"""From ``features.deepseek_v4`` to a quantisation-aware model (called by ``graft_pre_shard``).

The trained policy and the frozen KL reference are quantised alike: the policy's log-probs are
computed through the quantised forward (that is the point of QAT: it is the policy that
generates), so the reference the KL penalty compares them with must be too; otherwise the penalty
starts above 0 and charges the policy for the quantisation error itself. The reference is
quantised once (it never changes); the policy once per optimizer step, masters restored for the
optimizer. Rollout's plain decode copy (``rollout.decode=static``) is quantised like the policy
(`mirror_qat`): it is the policy that generates.
"""

from __future__ import annotations

from typing import Any

import torch

from graft.errors import ConfigError
from graft_deepseek_v4.precision import resolve_targets
from graft_deepseek_v4.qat import QatModel, apply_qat
from graft_deepseek_v4.quant.kernels import select_kernels
from graft_deepseek_v4.weights import restore_before_optimizer_steps

# The attribute of a model that holds its `QatModel` (the policy's tells its decode copy what to
# install; the copy's is installed once and requantised after every refresh).
QAT_STATE = "_graft_deepseek_v4_qat"


def install_qat(model: torch.nn.Module, cfg: Any, role: str, mesh: Any = None) -> QatModel | None:
    """Apply ``features.deepseek_v4.qat`` to ``model`` (``role``: ``policy`` or ``reference``;
    ``mesh``: the data-parallel mesh, whose device type is the run's); None when QAT is off."""
    section = cfg.features.deepseek_v4
    if section.qat == "none":
        return None
    model_type = getattr(model.config, "model_type", None)
    if model_type != "deepseek_v4":
        raise ConfigError(f"features.deepseek_v4.qat={section.qat} quantises DeepSeek-V4 models; "
                          f"this model is {model_type!r}. Set features.deepseek_v4.qat=none or "
                          f"use a DeepSeek-V4 model (model.preset=tiny-deepseek-v4, model.path)")
    device = run_device(cfg, mesh)
    kernels = select_kernels(section.qat_kernel, device)
    dtype = expert_dtype(section.expert_dtype, model.config)
    targets = resolve_targets(model, list(model.get_decoder().layers), expert_dtype=dtype)
    gemm = None
    if section.qat == "fp8_blockwise_gemm":
        from graft_deepseek_v4.fp8_gemm import check_fp8_gemm_support, scaled_mm_blockwise

        check_fp8_gemm_support(device)
        gemm = scaled_mm_blockwise
    state = apply_qat(model, targets, kernels=kernels, expert_dtype=dtype,
                      keep_masters=role == "policy", gemm=gemm)
    if role == "policy":
        restore_before_optimizer_steps(state.weights)
        setattr(model, QAT_STATE, state)
    return state


def mirror_qat(copy: torch.nn.Module, trained: torch.nn.Module) -> QatModel | None:
    """Quantise rollout's decode copy of ``trained`` as ``trained`` is quantised
    (``graft_inference_copy``, after every refresh of the copy's weights).

    The first call installs on ``copy`` the QAT of ``trained`` (same kernels, expert format and
    FP8 GEMMs; no masters: the copy is never trained); every call quantises the master weights
    the refresh just copied in. None (nothing done) when ``trained`` has no QAT.
    """
    policy = getattr(trained, QAT_STATE, None)
    if policy is None:
        return None
    state = getattr(copy, QAT_STATE, None)
    if state is None:
        targets = resolve_targets(copy, list(copy.get_decoder().layers),
                                  expert_dtype=policy.expert_dtype)
        state = apply_qat(copy, targets, kernels=policy.kernels, expert_dtype=policy.expert_dtype,
                          keep_masters=False, gemm=policy.gemm)
        setattr(copy, QAT_STATE, state)
    state.weights.requantize()
    return state


def expert_dtype(setting: str, config: Any) -> str:
    """``features.deepseek_v4.expert_dtype``, with ``auto`` read from the model config's
    ``expert_dtype`` (DeepSeek-V4-Flash: ``fp4``), ``fp8`` when it has none."""
    if setting != "auto":
        return setting
    value = getattr(config, "expert_dtype", None) or "fp8"
    if value not in ("fp4", "fp8"):
        raise ConfigError(f"the model config's expert_dtype is {value!r}; DeepSeek-V4 experts are "
                          f"fp4 or fp8. Set features.deepseek_v4.expert_dtype=fp4 or fp8")
    return value


def run_device(cfg: Any, mesh: Any = None) -> torch.device:
    """The device the run computes on: the mesh's device type, else ``engine.device``
    (``auto``: CUDA when present)."""
    kind = getattr(mesh, "device_type", None) or cfg.engine.device
    if kind == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())
