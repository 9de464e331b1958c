"""`graft_exact.rotary`: which modeling modules get the one-kernel exact rotary, and that
the wrapper calls the original wherever the kernel does not run (here, on CPU)."""

from __future__ import annotations

import sys

import torch
from graft_exact import exact_kernels
from graft_exact.rotary import install_exact_rotary, llama_form_rotary
from transformers import AutoModelForCausalLM

from graft.models.builtin import tiny_llama, tiny_qwen3_moe


def test_the_presets_modeling_modules_get_the_wrapper_once() -> None:
    llama = AutoModelForCausalLM.from_config(tiny_llama())
    moe = AutoModelForCausalLM.from_config(tiny_qwen3_moe())
    assert install_exact_rotary(llama) == ["transformers.models.llama.modeling_llama"]
    module = sys.modules["transformers.models.llama.modeling_llama"]
    wrapper = module.apply_rotary_pos_emb
    assert install_exact_rotary(llama) == ["transformers.models.llama.modeling_llama"]
    assert module.apply_rotary_pos_emb is wrapper  # not wrapped twice
    assert install_exact_rotary(moe) == ["transformers.models.qwen3_moe.modeling_qwen3_moe"]


def test_a_module_of_another_rotary_is_left_alone() -> None:
    import transformers.models.gpt_oss.modeling_gpt_oss as gpt_oss

    assert not llama_form_rotary(gpt_oss)  # its rotation has a formula of its own
    assert not llama_form_rotary(torch.nn)  # no apply_rotary_pos_emb at all


def test_on_cpu_the_wrapper_computes_the_original() -> None:
    torch.manual_seed(0)
    module = sys.modules["transformers.models.llama.modeling_llama"]
    install_exact_rotary(AutoModelForCausalLM.from_config(tiny_llama()))
    q, k = torch.randn(2, 4, 3, 8), torch.randn(2, 2, 3, 8)
    angles = torch.randn(2, 3, 4).repeat(1, 1, 2)
    original = module.apply_rotary_pos_emb.__wrapped__
    with exact_kernels():
        got = module.apply_rotary_pos_emb(q, k, angles.cos(), angles.sin())
    expected = original(q, k, angles.cos(), angles.sin())
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
