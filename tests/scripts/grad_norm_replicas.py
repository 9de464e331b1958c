"""The gradient norm on DTensor gradients laid out every way the meshes allow: sharded over all
ranks, replicated, and split over ``ep`` and ``efsdp`` (an expert-parallel block).

    torchrun --nproc-per-node 4 grad_norm_replicas.py OUT_JSON

Every rank writes its ``clip_grad_norm`` result; the reference is the norm of the full tensors.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from graft.engine.distributed.env import end_torchrun_worker, init_distributed, shutdown_distributed
from graft.engine.distributed.grad_norm import clip_grad_norm


def parameter(full: torch.Tensor, mesh, placements) -> torch.nn.Parameter:
    param = torch.nn.Parameter(distribute_tensor(torch.zeros_like(full), mesh, placements))
    param.grad = distribute_tensor(full, mesh, placements)
    return param


def main(out: str) -> None:
    env = init_distributed(device_preference="cpu", ep_size=2)
    torch.manual_seed(0)  # the same full gradients on every rank
    full = {name: torch.randn(8, 3) for name in ("sharded", "replicated", "experts", "mixed")}
    world = env.meshes.world
    params = [parameter(full["sharded"], env.meshes["dp"], [Shard(0)]),
              parameter(full["replicated"], env.meshes["dp"], [Replicate()]),
              parameter(full["experts"], world, [Shard(0), Shard(0)]),
              parameter(full["mixed"], world, [Replicate(), Shard(0)])]
    plain = torch.nn.Parameter(torch.zeros(4))
    plain.grad = torch.full((4,), 0.5)
    norm = clip_grad_norm([*params, plain], float("inf"))
    expected = torch.cat([t.reshape(-1) for t in [*full.values(), plain.grad]]).norm()
    results = [None] * dist.get_world_size()
    dist.all_gather_object(results, [float(norm), float(expected)])
    if env.is_main:
        with open(out, "w") as handle:
            json.dump(results, handle)


if __name__ == "__main__":
    main(sys.argv[1])
    shutdown_distributed()
    end_torchrun_worker()
