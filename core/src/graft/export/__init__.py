"""Weight export: HF-layout handlers, streamed bucketed and delta export, sinks.

Submodules: `graft.export.stream` (`WeightExporter`, `hf_tensors`), `graft.export.handlers`
(`export_slots`, `enumerate_hf_slots`), `graft.export.sinks`. This package module imports
nothing heavy.
"""

from graft.export.context import CONSUMERS, HF_LAYOUT, VLLM_LAYOUT, ExportContext

__all__ = ["CONSUMERS", "HF_LAYOUT", "VLLM_LAYOUT", "ExportContext"]
