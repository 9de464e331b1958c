"""QAT weights under FSDP2 on 2 ranks (gloo): each rank's shard of the quantised weight equals
its slice of the fake quant of the full weight, whether the shard holds whole tiles (quantised
where it is, without gathering) or not (gathered once); restoring gives the masters back bit for
bit. Then the same on 2-D meshes (HSDP's replicate x shard, and shards split again): shards of
whole tiles are quantised in place and equal the gathered path.

usage: torchrun --nproc-per-node 2 sharded_weights.py
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from graft.engine.distributed.env import end_torchrun_worker, init_distributed, shutdown_distributed
from graft_deepseek_v4.quant import fp4_groupwise, fp8_blockwise
from graft_deepseek_v4.weights import (
    QuantizedWeight,
    WeightQuantizer,
    quantized_by_gathering,
    quantized_local,
    shard_holds_whole_tiles,
)


class Weights(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.aligned = torch.nn.Parameter(torch.randn(512, 256, generator=generator))
        self.misaligned = torch.nn.Parameter(torch.randn(384, 256, generator=generator))
        self.experts = torch.nn.Parameter(torch.randn(4, 256, 128, generator=generator))


def tiles(x: torch.Tensor) -> torch.Tensor:
    return fp8_blockwise(x, (128, 128))[0]


def groups(x: torch.Tensor) -> torch.Tensor:
    return fp4_groupwise(x, 32)[0]


QUANTISE = {"aligned": (tiles, 128), "misaligned": (tiles, 128), "experts": (groups, 1)}


@contextmanager
def no_gathering():
    """Fail if anything gathers a DTensor (the in-place path must not)."""
    original = DTensor.full_tensor

    def refuse(self, *args, **kwargs):
        raise AssertionError("gathered a shard that holds whole tiles")

    DTensor.full_tensor = refuse
    try:
        yield
    finally:
        DTensor.full_tensor = original


def one_dimensional_mesh(env) -> None:
    module = Weights()
    full = {name: p.detach().clone() for name, p in module.named_parameters()}
    fully_shard(module, mesh=env.mesh)
    quantizer = WeightQuantizer([QuantizedWeight(name, module, name, *QUANTISE[name])
                                 for name in full], keep_masters=True)
    assert shard_holds_whole_tiles(module.aligned, 128)
    assert not shard_holds_whole_tiles(module.misaligned, 128)
    assert shard_holds_whole_tiles(module.experts, 1)
    quantizer.quantize()
    quantizer.quantize()  # idempotent until restored
    assert quantizer.passes == 1
    for name, value in full.items():
        quantise = QUANTISE[name][0]
        expected = quantise(value.bfloat16()).float().chunk(env.world_size)[env.rank]
        assert torch.equal(getattr(module, name).to_local(), expected), name
    quantizer.restore()
    for name, value in full.items():
        assert torch.equal(getattr(module, name).to_local(), value.chunk(env.world_size)[env.rank])


def two_dimensional_meshes(env) -> None:
    """(mesh shape, placements, parameter): in place (no gather) where the shards hold whole
    tiles, gathered otherwise; both equal this rank's slice of the full fake quant."""
    full = {name: p.detach().clone() for name, p in Weights().named_parameters()}
    cases = [((1, 2), (Replicate(), Shard(0)), "aligned", True),  # HSDP, 2 shards
             ((2, 1), (Shard(0), Replicate()), "aligned", True),  # HSDP, 2 replicas
             ((2, 1), (Shard(0), Shard(0)), "aligned", True),  # shards split again
             ((1, 2), (Replicate(), Shard(0)), "experts", True),
             ((1, 2), (Replicate(), Shard(0)), "misaligned", False),  # 192-row shards
             ((1, 2), (Replicate(), Shard(1)), "aligned", False)]  # column shards
    for shape, placements, name, in_place in cases:
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=("replicate", "shard"))
        holder = torch.nn.Module()
        holder.weight = torch.nn.Parameter(distribute_tensor(full[name], mesh, placements))
        quantise, tile_rows = QUANTISE[name]
        weight = QuantizedWeight(name, holder, "weight", quantise, tile_rows)
        assert shard_holds_whole_tiles(holder.weight, tile_rows) is in_place, (shape, name)
        expected = distribute_tensor(quantise(full[name].bfloat16()).float(), mesh,
                                     placements).to_local()
        if in_place:
            with no_gathering():
                ours = quantized_local(weight)
        else:
            ours = quantized_local(weight)
        assert torch.equal(ours, expected), (shape, placements, name)
        assert torch.equal(ours, quantized_by_gathering(weight)), (shape, placements, name)


def main() -> None:
    env = init_distributed(device_preference="cpu")
    one_dimensional_mesh(env)
    two_dimensional_meshes(env)
    print(f"rank {env.rank}: ok", flush=True)


if __name__ == "__main__":
    main()
    shutdown_distributed()
    end_torchrun_worker()
