"""`graft_exact.norm`: which RMSNorms take the one-kernel exact forward, and that on CPU
(where the kernel does not run) a model computes exactly what it did before."""

from __future__ import annotations

import copy

import torch
from graft_exact import exact_kernels, install_exact_kernels
from graft_exact.norm import install_exact_norms, llama_form_rms_norm
from transformers import AutoModelForCausalLM
from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from graft.models.builtin import tiny_llama, tiny_qwen3_moe


def _swapped(model: torch.nn.Module) -> list[str]:
    return [name for name, module in model.named_modules() if "forward" in vars(module)]


def test_the_llama_form_norms_of_the_presets_take_the_exact_forward() -> None:
    llama = AutoModelForCausalLM.from_config(tiny_llama())
    moe = AutoModelForCausalLM.from_config(tiny_qwen3_moe())
    assert install_exact_norms(llama) == 2 * 2 + 1  # two per layer and the final norm
    # Qwen3 also normalises each head's queries and keys
    assert install_exact_norms(moe) == 4 * 2 + 1
    assert "model.layers.0.self_attn.q_norm" in _swapped(moe)
    assert all(name.endswith(("norm", "layernorm")) for name in _swapped(moe))


def test_a_norm_of_another_form_keeps_its_forward() -> None:
    assert llama_form_rms_norm(LlamaRMSNorm(8))
    assert not llama_form_rms_norm(GemmaRMSNorm(8))  # weight + 1
    assert not llama_form_rms_norm(torch.nn.LayerNorm(8))
    holder = torch.nn.Sequential(GemmaRMSNorm(8), torch.nn.LayerNorm(8))
    assert install_exact_norms(holder) == 0 and _swapped(holder) == []


def test_on_cpu_the_exact_model_computes_what_it_did_before_and_a_copy_keeps_its_own_norms() -> None:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_llama())
    ids = torch.randint(0, model.config.vocab_size, (2, 12))
    install_exact_kernels(model)
    with exact_kernels():
        swapped = model(input_ids=ids).logits
    twin = copy.deepcopy(model)
    for name in _swapped(model):
        del model.get_submodule(name).forward  # the class's own forward again
    with exact_kernels():
        assert torch.equal(model(input_ids=ids).logits, swapped)
    norm = twin.model.layers[0].input_layernorm
    assert norm.forward.__self__ is norm  # bound to the copy, not to the original's norm
