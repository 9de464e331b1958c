"""QAT on a model: straight-through gradients, weights quantised once per optimizer step with the
masters restored for the optimizer, every GEMM's operands and the KV cache on their FP8/FP4 grids
(experts in the configured format), the frozen reference, off by default."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

import graft
import graft_deepseek_v4.plugin as plugin
from graft.config import ModelConfig
from graft.models import build_model
from graft_deepseek_v4.install import install_qat
from graft_deepseek_v4.precision import PRECISION_MAP, Target, resolve_targets
from graft_deepseek_v4.qat import apply_qat
from graft_deepseek_v4.quant import fp4_groupwise, fp8_blockwise
from graft_deepseek_v4.quant.kernels import torch_kernels
from graft_deepseek_v4.weights import restore_before_optimizer_steps

RULES = {rule.path: rule for rule in PRECISION_MAP}
TOKENS = torch.tensor([[1, 70, 83, 84, 93, 4, 69, 70, 71, 30, 21, 22, 15, 23, 33, 40, 41, 42]])


class CountingKernels:
    """The PyTorch kernels, counting weight (128x128 tile) quantisations."""

    def __init__(self) -> None:
        self.weight_calls = 0
        reference = torch_kernels()
        self.kernels = replace(reference, fp8=self._fp8)
        self._reference = reference

    def _fp8(self, x: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
        self.weight_calls += block == (128, 128)
        return self._reference.fp8(x, block)


def tiny_qat(*, keep_masters: bool = True, kernels=None) -> tuple[torch.nn.Module, object]:
    model, _ = build_model(ModelConfig(preset="tiny-deepseek-v4"), seed=0)
    targets = resolve_targets(model, list(model.model.layers), expert_dtype="fp8")
    state = apply_qat(model, targets, kernels=kernels or torch_kernels(), expert_dtype="fp8",
                      keep_masters=keep_masters)
    return model, state


def test_ste_gradient_is_the_bf16_layer_s_at_the_fake_quantised_weight() -> None:
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(256, 128, bias=False))
    master = layer[0].weight.detach().clone()
    apply_qat(layer, [Target("0", layer[0], RULES["self_attn.q_a_proj"])],
              kernels=torch_kernels(), expert_dtype="fp8", keep_masters=True)
    x = torch.randn(3, 5, 256, requires_grad=True)
    grad_out = torch.randn(3, 5, 128)
    (layer(x) * grad_out).sum().backward()

    # The plain layer, evaluated at the fake-quantised weight and input.
    weight_q = fp8_blockwise(master.bfloat16(), (128, 128))[0].float().requires_grad_()
    x_q = fp8_blockwise(x.detach().bfloat16(), (1, 128))[0].float().requires_grad_()
    (torch.nn.functional.linear(x_q, weight_q) * grad_out).sum().backward()
    assert torch.equal(layer[0].weight.grad, weight_q.grad)
    assert torch.equal(x.grad, x_q.grad)
    assert torch.equal(layer[0].weight.detach(), weight_q.detach()), "quantised in place"


def test_weights_are_quantised_once_per_optimizer_step_and_masters_restored() -> None:
    counting = CountingKernels()
    model, state = tiny_qat(kernels=counting.kernels)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    restore_before_optimizer_steps(state.weights)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    weight = model.model.layers[0].self_attn.q_a_proj.weight
    for step in range(2):
        master = weight.detach().clone()
        model.eval()
        with torch.no_grad():
            model(TOKENS)  # a log-prob pass before the update
        assert torch.equal(weight.detach(), fp8_blockwise(master.bfloat16(), (128, 128))[0].float())
        model.train()
        for _ in range(3):  # micro-batches, each recomputed in backward (checkpointing)
            model(TOKENS).logits.logsumexp(-1).mean().backward()
        optimizer.step()  # the masters are back before AdamW reads them
        optimizer.zero_grad()
        assert state.weights.passes == step + 1
        assert not torch.equal(weight.detach(), master), "AdamW updated the master"
        assert not torch.equal(weight.detach(), fp8_blockwise(weight.detach().bfloat16(),
                                                              (128, 128))[0].float())
    weights_per_pass = sum(1 for w in state.weights.weights)  # experts: two stacked tensors
    assert counting.weight_calls == 2 * weights_per_pass


def test_the_kv_cache_is_quantised_on_its_non_rope_channels_only() -> None:
    model, _ = tiny_qat()
    seen = []
    norm = model.model.layers[0].self_attn.kv_norm
    norm.register_forward_hook(lambda module, args, out: seen.append((args[0], out)))
    with torch.no_grad():
        model(TOKENS)
    kv_in, kv_out = seen[0]
    expected = norm.weight * kv_in * torch.rsqrt(kv_in.pow(2).mean(-1, keepdim=True) + 1e-6)
    nope = 128 - model.config.qk_rope_head_dim
    assert nope == 64
    assert torch.equal(kv_out[..., nope:], expected[..., nope:])
    quantised = fp8_blockwise(expected[..., :nope].bfloat16(), (1, 64))[0].float()
    torch.testing.assert_close(kv_out[..., :nope], quantised, rtol=0, atol=0)


def installed(expert_dtype: str) -> tuple[torch.nn.Module, object]:
    """The tiny model with QAT as ``graft_pre_shard`` installs it (frozen: no masters)."""
    cfg = graft.compose(["model.preset=tiny-deepseek-v4", "features.deepseek_v4.qat=fp8_blockwise",
                         f"features.deepseek_v4.expert_dtype={expert_dtype}"])
    model, _ = build_model(cfg.model, seed=0)
    return model, install_qat(model, cfg, "reference")


def on_grid(x: torch.Tensor, quantise) -> bool:
    """``x`` is a fake-quantised value (quantising it again changes nothing) and not 0."""
    x = x.detach().bfloat16()
    return bool(x.abs().max() > 0) and torch.equal(quantise(x), x)


def rows(x: torch.Tensor) -> torch.Tensor:
    return fp8_blockwise(x, (1, 128))[0]


@pytest.mark.parametrize("experts", ["fp4", "fp8"])
def test_expert_weights_are_quantised_in_the_configured_format(experts: str) -> None:
    model, _ = installed(experts)
    module = model.model.layers[1].mlp.experts
    masters = {attr: getattr(module, attr).detach().clone() for attr in ("gate_up_proj",
                                                                         "down_proj")}
    with torch.no_grad():
        model(TOKENS)
    for attr, master in masters.items():
        fp4, fp8 = fp4_groupwise(master.bfloat16(), 32)[0], fp8_blockwise(master.bfloat16(),
                                                                           (128, 128))[0]
        assert not torch.equal(fp4, fp8)
        expected = fp4 if experts == "fp4" else fp8
        assert torch.equal(getattr(module, attr), expected.to(master.dtype)), attr


@pytest.mark.parametrize("experts", ["fp4", "fp8"])
def test_every_gemm_of_the_experts_reads_fp8_activations(experts: str) -> None:
    """The experts' input and their gated activation (the second GEMM's input) are FP8 1x128
    tiles; without QAT the same tensors are not."""
    seen: dict[str, list[torch.Tensor]] = {"input": [], "gated": []}

    def record(model: torch.nn.Module) -> None:
        module = model.model.layers[1].mlp.experts
        module.register_forward_pre_hook(lambda m, args: seen["input"].append(args[0]))
        gate = module._apply_gate  # QAT's (quantising) gate where installed
        module._apply_gate = lambda gate_up: seen["gated"].append(gate(gate_up)) or seen[
            "gated"][-1]

    plain, _ = build_model(ModelConfig(preset="tiny-deepseek-v4"), seed=0)
    record(plain)
    with torch.no_grad():
        plain(TOKENS)
    assert seen["input"] and seen["gated"]
    assert not any(on_grid(x, rows) for values in seen.values() for x in values)
    seen = {"input": [], "gated": []}
    model, _ = installed(experts)
    record(model)
    with torch.no_grad():
        model(TOKENS)
    assert seen["input"] and seen["gated"]
    assert all(on_grid(x, rows) for values in seen.values() for x in values)


def test_every_quantised_linear_layer_reads_fp8_weights_and_inputs() -> None:
    model, state = installed("fp8")
    linear = [t for t in state.targets if isinstance(t.module, torch.nn.Linear)]
    inputs: dict[str, torch.Tensor] = {}
    for target in linear:
        target.module.register_forward_pre_hook(
            lambda m, args, name=target.name: inputs.setdefault(name, args[0]))
    with torch.no_grad():
        model(TOKENS)
    assert len(linear) == 17 and set(inputs) == {t.name for t in linear}
    for target in linear:
        assert on_grid(target.module.weight, lambda w: fp8_blockwise(w, (128, 128))[0]), target.name
        assert on_grid(inputs[target.name], rows), target.name


def test_the_frozen_reference_matches_the_policy_and_keeps_no_masters() -> None:
    policy, _ = tiny_qat(keep_masters=True)
    reference, state = tiny_qat(keep_masters=False)
    with torch.no_grad():
        assert torch.equal(policy(TOKENS).logits, reference(TOKENS).logits), "KL starts at 0"
    assert all(w.master is None for w in state.weights.weights)
    state.weights.restore()  # a frozen model stays quantised
    with torch.no_grad():
        reference(TOKENS)
    assert state.weights.passes == 1


def test_off_by_default_the_model_is_untouched(graft_plugin) -> None:
    manager = graft_plugin(plugin, name="deepseek_v4")
    cfg = graft.compose(["model.preset=tiny-deepseek-v4"], manager=manager)
    assert cfg.features.deepseek_v4.qat == "none"
    model, _ = build_model(cfg.model, seed=0)
    before = copy.deepcopy(model)
    manager.hook.graft_pre_shard(model=model, cfg=cfg, mesh=None, role="policy", meshes=None)
    with torch.no_grad():
        assert torch.equal(model(TOKENS).logits, before(TOKENS).logits)
    assert not any(m._forward_pre_hooks for m in model.modules())
