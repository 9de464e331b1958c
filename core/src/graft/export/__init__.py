"""Weight export: HF-layout handlers, streamed bucketed export, sinks.

Public API, for plugins that export into their own consumer (an inference engine's sink):

* `ExportContext` (what ``graft_export_slots`` handlers get) and the consumers, `CONSUMERS`:
  `HF_LAYOUT` (transformers' checkpoint layout) and `INFERENCE_LAYOUT` (a serving engine's
  weight loader, a sink's ``consumer`` attribute).
* `WeightExporter` (exports of a live, possibly sharded model, again and again, into a sink),
  `default_bucket_bytes` (``export.bucket_mb`` in bytes for a device) and `hf_directory_sink`
  (a sink writing a Hugging Face directory).
* For a sink of one's own: `StagingSink` (stages every bucket on the host and applies nothing
  before ``finish``) and `RowBlock` (rows of an expert-parallel fused tensor, for sinks with
  ``consume_rows``).
* For an exporter that sends less than every tensor (graft-vllm's delta export):
  `ExportFilter` (``WeightExporter(entry_filter=...)`` sees each entry and drops, replaces or
  turns it into an update) and `UpdateSink` (a sink that applies such updates).

Submodules (`graft.export.stream`, `graft.export.handlers`, `graft.export.sinks`...) are the
core's own. Importing this package is cheap: the names that need torch load on first access.
"""

from typing import Any

from graft.export.context import CONSUMERS, HF_LAYOUT, INFERENCE_LAYOUT, ExportContext

__all__ = ["CONSUMERS", "HF_LAYOUT", "INFERENCE_LAYOUT", "ExportContext", "ExportFilter",
           "RowBlock", "StagingSink", "UpdateSink", "WeightExporter", "default_bucket_bytes",
           "hf_directory_sink"]

_MODULE_OF = {
    **dict.fromkeys(["ExportFilter", "RowBlock", "StagingSink", "UpdateSink"],
                    "graft.export.sinks.base"),
    **dict.fromkeys(["WeightExporter", "default_bucket_bytes"], "graft.export.stream"),
    "hf_directory_sink": "graft.export.hf",
}


def __getattr__(name: str) -> Any:
    if name in _MODULE_OF:
        import importlib

        return getattr(importlib.import_module(_MODULE_OF[name]), name)
    raise AttributeError(f"module 'graft.export' has no attribute {name!r}")
