"""What a CUDA graph cannot capture in a model's decode step.

transformers' ``eager`` experts loop over the experts the batch hit, which they find with
``nonzero`` on the host: a capture fails there ("operation not permitted when stream is
capturing", seen on a GPU with graft-exact's kernels on tiny-qwen3-moe when they used them; they
now give such models an experts implementation of their own). Such a model's decode step runs
eagerly (`graft_graphed_decode.decoder.GraphedDecoder` without graphs, as on CPU).
"""

from __future__ import annotations

import torch


def host_synchronising_experts(model: torch.nn.Module) -> list[str]:
    """Names of ``model``'s MoE experts modules (transformers' experts convention:
    ``num_experts``, ``has_gate``) that run transformers' ``eager`` loop over the hit experts."""
    return [name for name, module in model.named_modules()
            if hasattr(module, "num_experts") and hasattr(module, "has_gate")
            and getattr(getattr(module, "config", None), "_experts_implementation",
                        "eager") in (None, "eager")]
