"""The global gradient norm and clipping, computed on FSDP2's local gradient shards.

``torch.nn.utils.clip_grad_norm_`` dispatches every norm and scale through DTensor; here the
local shards go through one multi-tensor norm, one all-reduce of the sum of squares, and one
multi-tensor scale.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.distributed.tensor import DTensor

from graft.engine.distributed import all_reduce

EPS = 1e-6


def clip_grad_norm(parameters: Iterable[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """Scale gradients so their global L2 norm is at most ``max_norm`` (``inf``: no clipping).

    Returns the norm before clipping (fp32). Sharded (DTensor) gradients contribute their
    squares summed over ranks; plain ones count once.
    """
    sharded, plain = [], []
    for param in parameters:
        if param.grad is None:
            continue
        if isinstance(param.grad, DTensor):
            sharded.append(param.grad.to_local())
        else:
            plain.append(param.grad)
    device = (sharded or plain)[0].device if sharded or plain else torch.device("cpu")
    squares = torch.zeros((), dtype=torch.float32, device=device)
    if sharded:
        squares = squares + torch.stack(torch._foreach_norm(sharded)).float().square().sum()
        squares = all_reduce(squares)
    if plain:
        squares = squares + torch.stack(torch._foreach_norm(plain)).float().square().sum()
    total = squares.sqrt()
    if max_norm != float("inf") and (sharded or plain):
        scale = (max_norm / (total + EPS)).clamp(max=1.0)
        torch._foreach_mul_(sharded + plain, scale)
    return total
