"""QAT weights under FSDP2 on 2 ranks (gloo): each rank's shard of the quantised weight equals
its slice of the fake quant of the full weight, whether the shard holds whole tiles (quantised
where it is) or not (gathered once); restoring gives the masters back bit for bit.

usage: torchrun --nproc-per-node 2 sharded_weights.py
"""

from __future__ import annotations

import torch
from torch.distributed.fsdp import fully_shard

from graft.engine.distributed import end_torchrun_worker, init_distributed, shutdown_distributed
from graft_deepseek_v4.quant import fp4_groupwise, fp8_blockwise
from graft_deepseek_v4.weights import QuantizedWeight, WeightQuantizer, shard_holds_whole_tiles


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


def main() -> None:
    env = init_distributed(device_preference="cpu")
    module = Weights()
    full = {name: p.detach().clone() for name, p in module.named_parameters()}
    fully_shard(module, mesh=env.mesh)
    quantizer = WeightQuantizer([QuantizedWeight("aligned", module, "aligned", tiles, 128),
                                 QuantizedWeight("misaligned", module, "misaligned", tiles, 128),
                                 QuantizedWeight("experts", module, "experts", groups, 1)],
                                keep_masters=True)
    assert shard_holds_whole_tiles(module.aligned, 128)
    assert not shard_holds_whole_tiles(module.misaligned, 128)
    assert shard_holds_whole_tiles(module.experts, 1)
    quantizer.quantize()
    quantizer.quantize()  # idempotent until restored
    assert quantizer.passes == 1
    quantize = {"aligned": tiles, "misaligned": tiles, "experts": groups}
    for name, value in full.items():
        expected = quantize[name](value.bfloat16()).float().chunk(env.world_size)[env.rank]
        assert torch.equal(getattr(module, name).to_local(), expected), name
    quantizer.restore()
    for name, value in full.items():
        assert torch.equal(getattr(module, name).to_local(), value.chunk(env.world_size)[env.rank])
    print(f"rank {env.rank}: ok", flush=True)


if __name__ == "__main__":
    main()
    shutdown_distributed()
    end_torchrun_worker()
