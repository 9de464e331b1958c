"""Export sinks: a Hugging Face directory, an in-memory dict (plugins add their own: graft-vllm's
vLLM engine), and the filter protocol of an exporter."""

from graft.export.sinks.base import ExportFilter, UpdateSink, WeightSink

__all__ = ["ExportFilter", "UpdateSink", "WeightSink"]
