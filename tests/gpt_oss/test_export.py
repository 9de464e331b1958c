"""GPT-OSS export handlers: fused experts passed through for a HF checkpoint, one expert at a
time (global ids) for vLLM; the exports of an EP=2 model (2 gloo ranks, `ep_equivalence`),
checked against the code's own indexing and, independently, by loading the per-expert export
with transformers' own loader."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from graft.config import ModelConfig
from graft.export.context import INFERENCE_LAYOUT, ExportContext
from graft.export.handlers import enumerate_hf_slots, export_slots, meta_skeleton
from graft.models import build_model
from graft_gpt_oss.export import gpt_oss_expert_slots

EXPERTS = "model.layers.1.mlp.experts"


@pytest.fixture(scope="module")
def tiny() -> torch.nn.Module:
    return build_model(ModelConfig(preset="tiny-gpt-oss"))[0]


@pytest.fixture
def ctx(tiny: torch.nn.Module) -> ExportContext:
    return ExportContext(tiny, "gpt_oss", meta_skeleton(tiny))


def test_hf_checkpoint_gets_the_fused_experts_unchanged(tiny, ctx) -> None:
    for name, tensor in tiny.state_dict().items():
        assert [(n, t) for n, t in export_slots(name, tensor, ctx)] == [(name, tensor)], name


def test_vllm_gets_each_expert_under_its_global_id(tiny, ctx) -> None:
    fused = tiny.state_dict()[f"{EXPERTS}.gate_up_proj"]  # (E, H, 2I), gate/up interleaved
    block = fused[4:]  # ep rank 1's block of 2
    block_ctx = dataclasses.replace(ctx, consumer=INFERENCE_LAYOUT, expert_offset=4)
    slots = export_slots(f"{EXPERTS}.gate_up_proj", block, block_ctx)
    assert [name for name, _ in slots] == [f"{EXPERTS}.{i}.gate_up_proj" for i in range(4, 8)]
    for expert, (_, tensor) in enumerate(slots, start=4):
        assert tensor.shape == (64, 128) and torch.equal(tensor, fused[expert])


def test_enumerate_hf_slots_for_each_consumer(ctx) -> None:
    args = (f"{EXPERTS}.down_proj_bias", (8, 64), torch.float32)
    assert enumerate_hf_slots(*args, ctx) == [(f"{EXPERTS}.down_proj_bias", (8, 64))]
    per_expert = enumerate_hf_slots(*args, dataclasses.replace(ctx, consumer=INFERENCE_LAYOUT))
    assert per_expert == [(f"{EXPERTS}.{i}.down_proj_bias", (64,)) for i in range(8)]
    router = enumerate_hf_slots("model.layers.0.mlp.router.bias", (8,), torch.float32,
                                dataclasses.replace(ctx, consumer=INFERENCE_LAYOUT))
    assert router == [("model.layers.0.mlp.router.bias", (8,))]


def test_other_models_and_parameters_are_left_to_the_next_handler(ctx) -> None:
    tensor = torch.zeros(8, 4)
    vllm = dataclasses.replace(ctx, consumer=INFERENCE_LAYOUT)
    assert gpt_oss_expert_slots(f"{EXPERTS}.down_proj", tensor,
                                dataclasses.replace(vllm, model_type="qwen3_moe")) is None
    assert gpt_oss_expert_slots("model.layers.1.mlp.router.weight", tensor, vllm) is None


@pytest.mark.slow
def test_one_exporter_serves_both_layouts_without_expert_parallelism(
        ep_equivalence: dict) -> None:
    exports = ep_equivalence["ep1_exports"]  # 2 ranks, FSDP2 only: HF planned, vLLM streamed
    assert exports["planned"]
    hf, vllm = exports["hf"], exports["vllm"]
    assert len(vllm) == len(hf) - 8 + 8 * 8  # 8 fused tensors became 8 experts each
    for name, tensor in vllm.items():
        head, _, param = name.rpartition(".")
        fused, _, expert = head.rpartition(".")
        whole = hf[name] if name in hf else hf[f"{fused}.{param}"][int(expert)]
        assert torch.equal(tensor, whole), name


def test_ep2_export_in_hf_layout_equals_the_whole_parameters(ep_equivalence: dict) -> None:
    params, exported = ep_equivalence["params"], ep_equivalence["exports"]["hf"]
    assert exported.keys() == params.keys()
    for name, tensor in params.items():
        assert torch.equal(exported[name], tensor), name


def test_ep2_export_in_vllm_layout_has_every_expert_under_its_global_id(
        ep_equivalence: dict) -> None:
    params, exported = ep_equivalence["params"], ep_equivalence["exports"]["vllm"]
    experts = {name for name in exported if ".mlp.experts." in name}
    assert len(experts) == 2 * 4 * 8  # layers x parameters x experts, ranks 0 and 1 alike
    for name, tensor in exported.items():
        head, _, param = name.rpartition(".")
        if name in params:
            assert torch.equal(tensor, params[name]), name
            continue
        fused, _, expert = head.rpartition(".")
        assert torch.equal(tensor, params[f"{fused}.{param}"][int(expert)]), name


@pytest.mark.parametrize(("layout", "sent"), [
    # rows changed: 2 of layer 1's experts in down_proj (64 x 64 fp32 each), 2 expert biases of
    # layer 0's gate_up_proj_bias (128 each), 2 vocabulary rows (64); plus int64 row indices
    ("hf", 2 * (64 * 64 * 4 + 8) + 2 * (128 * 4 + 8) + 2 * (64 * 4 + 8)),
    # per expert: the two changed down_proj experts and biases whole, no indices
    ("vllm", 2 * 64 * 64 * 4 + 2 * 128 * 4 + 2 * (64 * 4 + 8)),
])
def test_ep2_delta_after_a_sparse_update_equals_a_full_export(ep_equivalence: dict, layout: str,
                                                             sent: int) -> None:
    exports = ep_equivalence["exports"]
    consumer, reference = exports[f"delta_{layout}"], exports[f"after_{layout}"]
    assert consumer.keys() == reference.keys()
    for name, tensor in reference.items():
        assert torch.equal(consumer[name], tensor), name
    bytes_sent, bytes_total = exports[f"delta_{layout}_bytes"]
    assert bytes_sent == sent and bytes_total > 30 * sent


def per_expert_conversion() -> list:
    """A transformers conversion mapping that loads per-expert GPT-OSS tensors
    (``...experts.<id>.<param>``) into the fused parameters, as transformers loads per-expert
    Mixtral or Qwen2-MoE checkpoints: its loader stacks the experts in the order of their ids."""
    from transformers.core_model_loading import MergeModulelist, WeightConverter

    return [WeightConverter(source_patterns=[f".experts.*.{param}"],
                            target_patterns=f".experts.{param}",
                            operations=[MergeModulelist(dim=0)])
            for param in ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")]


@pytest.fixture
def per_expert_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers loads ``gpt_oss`` checkpoints through `per_expert_conversion` in this test
    only (its registry is process-wide: a fresh one, put back afterwards)."""
    from transformers import conversion_mapping

    monkeypatch.setattr(conversion_mapping, "_checkpoint_conversion_mapping_cache", None)
    monkeypatch.setattr(conversion_mapping, "USER_REGISTERED_MAPPINGS", set())
    conversion_mapping.register_checkpoint_conversion_mapping("gpt_oss", per_expert_conversion())


def test_ep2_vllm_export_loaded_by_transformers_computes_the_trained_logits(
        ep_equivalence: dict, per_expert_loading: None, tmp_path: Path) -> None:
    """Independent of the exporter's indexing: transformers places each exported expert by the
    id in its name, and the model it builds computes exactly the trained model's logits (an
    expert under another id, or in another orientation, changes them or fails to load)."""
    from transformers import AutoModelForCausalLM

    trained = build_model(ModelConfig(preset="tiny-gpt-oss"))[0]
    trained.load_state_dict(ep_equivalence["params"])
    exported = ep_equivalence["exports"]["vllm"]
    assert f"{EXPERTS}.7.down_proj" in exported and f"{EXPERTS}.down_proj" not in exported
    trained.config.save_pretrained(tmp_path)
    save_file({name: tensor.contiguous() for name, tensor in reversed(exported.items())},
              tmp_path / "model.safetensors", metadata={"format": "pt"})  # ids, not file order
    loaded, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    batch = torch.tensor([[1, 70, 83, 84, 93, 4, 69, 70, 71, 30], [1, 21, 22, 15, 23, 33, 40, 41,
                                                                  42, 43]])
    with torch.no_grad():
        expected = trained.eval()(batch, use_cache=False).logits
        got = loaded.eval()(batch, use_cache=False).logits
    assert torch.equal(got, expected)
