"""Weight export: HF-layout handlers, streamed bucketed and delta export, sinks.

Public API, for plugins that export into their own consumer (an inference engine's sink):

* `ExportContext` (what ``graft_export_slots`` handlers get) and the consumers, `CONSUMERS`:
  `HF_LAYOUT` (transformers' checkpoint layout) and `INFERENCE_LAYOUT` (a serving engine's
  weight loader, a sink's ``consumer`` attribute).
* `WeightExporter` (full or delta exports of a live, possibly sharded model, again and again,
  into a sink), `default_bucket_bytes` (``export.bucket_mb`` in bytes for a device) and
  `hf_directory_sink` (a sink writing a Hugging Face directory).
* For a sink of one's own: `StagingSink` (stages every bucket on the host and applies nothing
  before ``finish``), `DeltaEntry` (a changed tensor or rows of it, ``export.delta``), and the
  per-expert names of fused experts tensors, `fused_name`, `expert_of_fused`, `split_fused`.

Submodules (`graft.export.stream`, `graft.export.handlers`, `graft.export.sinks`...) are the
core's own. Importing this package is cheap: the names that need torch load on first access.
"""

from typing import Any

from graft.export.context import CONSUMERS, HF_LAYOUT, INFERENCE_LAYOUT, ExportContext

__all__ = ["CONSUMERS", "HF_LAYOUT", "INFERENCE_LAYOUT", "DeltaEntry", "ExportContext",
           "StagingSink", "WeightExporter", "default_bucket_bytes", "expert_of_fused",
           "fused_name", "hf_directory_sink", "split_fused"]

_MODULE_OF = {
    **dict.fromkeys(["DeltaEntry", "StagingSink"], "graft.export.sinks.base"),
    **dict.fromkeys(["WeightExporter", "default_bucket_bytes"], "graft.export.stream"),
    **dict.fromkeys(["expert_of_fused", "fused_name", "split_fused"],
                    "graft.export.fused_experts"),
    "hf_directory_sink": "graft.export.hf",
}


def __getattr__(name: str) -> Any:
    if name in _MODULE_OF:
        import importlib

        return getattr(importlib.import_module(_MODULE_OF[name]), name)
    raise AttributeError(f"module 'graft.export' has no attribute {name!r}")
