"""`ExportContext`: what export handlers (``graft_export_slots``) know about the export."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Who loads the exported tensors, and so which names and layouts they want (a sink's
# ``consumer`` attribute; sinks without one are HF_LAYOUT):
HF_LAYOUT = "hf"  # transformers' checkpoint layout: what ``from_pretrained`` loads (HF directory,
#                   the in-memory state dict)
INFERENCE_LAYOUT = "inference"  # what a running inference engine's weight loader takes while
#                   it serves (graft-vllm's sink: vLLM's ``reload_weights``): a model whose
#                   experts are fused on disk may stream them one expert at a time
CONSUMERS = (HF_LAYOUT, INFERENCE_LAYOUT)


@dataclass(frozen=True)
class ExportContext:
    """The model being exported and how.

    Attributes:
        model: the trained model (possibly an FSDP2 module).
        model_type: ``model.config.model_type``.
        skeleton: the same architecture, unsharded, on the meta device: transformers' weight
            conversion mapping is resolved against it (FSDP2's class swap would hide the
            original module classes that some mappings depend on).
        dtype: the exported dtype (a ``torch.dtype``), or None to keep the trained dtype.
        expert_offset: global index of the first expert in the tensor a handler receives: 0 for
            whole tensors; for expert-parallel parameters streamed one ``ep`` block at a time
            (`graft.export.expert_blocks`), the id of the block's first expert.
        consumer: who loads the export (one of `CONSUMERS`): ``hf`` for transformers' checkpoint
            layout, ``inference`` for a serving engine's weight loader; a handler whose model is
            stored differently for the two (fused experts on disk, per-expert tensors streamed
            into the engine) picks by it.
    """

    model: Any
    model_type: str
    skeleton: Any = None
    dtype: Any = None
    expert_offset: int = 0
    consumer: str = HF_LAYOUT
