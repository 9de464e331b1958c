"""Per-expert names of a fused experts tensor: ``X.experts.<id>.<param>`` is expert ``<id>`` of
``X.experts.<param>`` (shape ``(num_experts, *per_expert_shape)``).

A model stored with fused experts on disk (GPT-OSS) is streamed into an inference engine
(consumer `graft.export.INFERENCE_LAYOUT`) one expert at a time under those per-expert names,
so what knew the fused tensor (the delta snapshot, the shapes the engine started with) must
recognise its experts under the new names.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, MutableMapping
from typing import Any

_PER_EXPERT = re.compile(r"^(?P<head>.*\.experts)\.(?P<id>\d+)\.(?P<param>[^.]+)$")


def fused_name(name: str) -> tuple[str, int] | None:
    """``(fused tensor name, expert id)`` of a per-expert name, or None for any other name."""
    match = _PER_EXPERT.match(name)
    if match is None:
        return None
    return f"{match['head']}.{match['param']}", int(match["id"])


def expert_of_fused(name: str, shape: tuple[int, ...],
                    shapes: Mapping[str, tuple[int, ...]]) -> bool:
    """True when ``name`` (of per-expert ``shape``) is one expert of a fused tensor listed in
    ``shapes`` (fused name -> fused shape)."""
    fused = fused_name(name)
    if fused is None or fused[0] not in shapes:
        return False
    whole = tuple(shapes[fused[0]])
    return len(whole) == len(shape) + 1 and whole[1:] == tuple(shape) and fused[1] < whole[0]


def split_fused(weights: MutableMapping[str, Any], name: str) -> bool:
    """When ``name`` is a per-expert name missing from ``weights`` whose fused tensor is there,
    replace the fused entry by one entry per expert (copies: safetensors refuses tensors that
    share memory); returns whether it did."""
    fused = fused_name(name)
    if name in weights or fused is None or fused[0] not in weights:
        return False
    whole = weights.pop(fused[0])
    head, param = fused[0].rsplit(".", 1)
    for expert in range(whole.shape[0]):
        weights[f"{head}.{expert}.{param}"] = whole[expert].clone()
    return True
