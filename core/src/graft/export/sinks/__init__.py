"""Export sinks: a Hugging Face directory, an in-memory dict, a vLLM engine."""

from graft.export.sinks.base import DeltaEntry, DeltaSink, WeightSink

__all__ = ["DeltaEntry", "DeltaSink", "WeightSink"]
