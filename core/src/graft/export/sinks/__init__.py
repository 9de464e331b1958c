"""Export sinks: a Hugging Face directory, an in-memory dict (plugins add their own: graft-vllm's
vLLM engine)."""

from graft.export.sinks.base import DeltaEntry, DeltaSink, WeightSink

__all__ = ["DeltaEntry", "DeltaSink", "WeightSink"]
