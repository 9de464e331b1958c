"""A model that keeps some parameters in another dtype (transformers 5.24 keeps DeepSeek-V3's
router in fp32 in a bf16 model) is sharded with those in FSDP2 units of their own, which keep
their masters and compute in that dtype; 2 gloo ranks train it as one does, from the preset and
from a local directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy

from graft.config import ModelConfig, compose
from graft.data.tokenizer import load_tokenizer
from graft.engine.distributed.dtype_units import shard_other_dtypes
from graft.models import build_model

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "mixed_dtype_model.py"
BF16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


class Router(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(4, 8))


class Attention(torch.nn.Module):
    """Its own parameter (sinks) in fp32, its projections in bf16."""

    def __init__(self) -> None:
        super().__init__()
        self.sinks = torch.nn.Parameter(torch.zeros(2))
        self.q_proj = torch.nn.Linear(8, 8).bfloat16()
        self.o_proj = torch.nn.Linear(8, 8).bfloat16()


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention = Attention()
        self.experts = torch.nn.Linear(8, 64).bfloat16()
        self.router = Router()  # fp32
        self.norm = torch.nn.LayerNorm(8).bfloat16()


def split(unit: torch.nn.Module) -> list[tuple[torch.nn.Module, MixedPrecisionPolicy]]:
    calls = []
    shard_other_dtypes(unit, lambda module, policy: calls.append((module, policy)), BF16)
    return calls


def test_each_submodule_in_another_dtype_gets_a_unit_that_computes_in_its_own_dtype() -> None:
    block = Block()
    calls = split(block)
    # the block keeps bf16 (most of its elements); the router and the attention (its own
    # parameter is fp32) leave it; the attention's bf16 projections leave the attention
    assert [module for module, _ in calls] == [block.attention.q_proj, block.attention.o_proj,
                                               block.attention, block.router]
    for _, policy in calls:
        assert policy.param_dtype is None and policy.reduce_dtype == torch.float32


def test_a_model_of_one_dtype_is_not_split() -> None:
    block = Block().float()
    assert split(block) == []


def test_a_module_whose_own_parameters_mix_dtypes_is_a_clear_error() -> None:
    router = Router()
    router.bias = torch.nn.Parameter(torch.zeros(4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="'Router' holds trainable parameters of dtypes"):
        split(router)
    router.bias.requires_grad_(False)  # frozen parameters do not count for FSDP2
    assert split(router) == []


def train(out: Path, ranks: int, hf_dir: Path | None = None) -> dict:
    out.mkdir()
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={ranks}", str(SCRIPT), str(out)]
    result = subprocess.run(command + ([str(hf_dir)] if hf_dir else []), capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return torch.load(out / "result.pt")


@pytest.mark.slow
def test_a_bf16_model_with_fp32_routers_trains_alike_on_one_and_two_ranks(tmp_path: Path) -> None:
    seed = compose([]).trainer.seed
    model, _ = build_model(ModelConfig(preset="tiny-deepseek-v3", dtype="bfloat16"), seed=seed)
    model.model.layers[1].mlp.gate.float()  # as the script's hook does
    model.save_pretrained(tmp_path / "hf")
    load_tokenizer(None, None).save_pretrained(tmp_path / "hf")
    one = train(tmp_path / "one", 1)
    for run in (train(tmp_path / "two", 2), train(tmp_path / "path", 2, tmp_path / "hf")):
        assert run["router_master"] == torch.float32
        assert run["computed"] == {"router": torch.float32, "experts": torch.bfloat16}
        assert run["losses"] == pytest.approx(one["losses"], rel=1e-3)
        for name, tensor in one["weights"].items():
            assert run["weights"][name].dtype == tensor.dtype, name
            torch.testing.assert_close(run["weights"][name], tensor, rtol=2e-2, atol=2e-3,
                                       msg=name)
    assert one["losses"][-1] < one["losses"][0]
