"""``qat=fp8_blockwise_gemm``: the FP8 block-scaled GEMM layer reproduces the fake-quant layer
(forward within bf16 rounding, same straight-through gradients). ``F.scaled_mm`` needs an SM90
GPU, so here the GEMM is emulated from the same FP8 codes and scales (on the GPU,
bench/qat.py measures the real one against the fake quant)."""

from __future__ import annotations

import pytest
import torch

import graft
import graft_deepseek_v4.plugin as plugin
from graft.errors import ConfigError
from graft.models import build_model
from graft_deepseek_v4.fp8_gemm import Fp8BlockLinear, emulated_blockwise
from graft_deepseek_v4.precision import PRECISION_MAP, Target
from graft_deepseek_v4.qat import apply_qat
from graft_deepseek_v4.quant.kernels import torch_kernels

RULE = next(rule for rule in PRECISION_MAP if rule.path == "self_attn.kv_proj")


def one_layer(gemm) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 384, bias=False))
    apply_qat(model, [Target("0", model[0], RULE)], kernels=torch_kernels(), expert_dtype="fp8",
              keep_masters=True, gemm=gemm)
    return model


def test_the_fp8_gemm_layer_reproduces_the_fake_quant_layer() -> None:
    fake, real = one_layer(None), one_layer(emulated_blockwise)
    assert isinstance(real[0], Fp8BlockLinear) and type(fake[0]) is torch.nn.Linear
    x = torch.randn(2, 7, 256) * 3  # 14 rows: padded to 16 for the GEMM
    grad_out = torch.randn(2, 7, 384)
    outputs, grads = [], []
    for model in (fake, real):
        inputs = x.clone().requires_grad_()
        out = model(inputs)
        (out * grad_out).sum().backward()
        outputs.append(out.detach())
        grads.append((inputs.grad, model[0].weight.grad))
    assert torch.equal(fake[0].weight, real[0].weight), "same fake-quantised weight"
    torch.testing.assert_close(outputs[1], outputs[0].bfloat16().float(), rtol=2**-8, atol=1e-6)
    torch.testing.assert_close(grads[1][0], grads[0][0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grads[1][1], grads[0][1], rtol=1e-6, atol=1e-5)


def test_fp8_gemm_on_cpu_is_a_config_error(graft_plugin) -> None:
    manager = graft_plugin(plugin, name="deepseek_v4")
    cfg = graft.compose(["model.preset=tiny-deepseek-v4", "engine.device=cpu",
                         "features.deepseek_v4.qat=fp8_blockwise_gemm"], manager=manager)
    model, _ = build_model(cfg.model)
    with pytest.raises(ConfigError, match=r"needs a CUDA GPU with FP8 tensor cores "
                                          r"\(compute capability 9\.0 or newer\).*"
                                          r"use features.deepseek_v4.qat=fp8_blockwise"):
        manager.hook.graft_pre_shard(model=model, cfg=cfg, mesh=None, role="policy", meshes=None)
