"""Exporting to a Hugging Face directory: from the live (sharded) model, or from a checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from graft.export.context import ExportContext
from graft.export.handlers import export_slots, meta_skeleton
from graft.export.sinks.hf_dir import HFDirectorySink
from graft.export.stream import ExportStats, WeightExporter, default_bucket_bytes, resolve_dtype


def hf_directory_sink(model: torch.nn.Module, out_dir: Path, *, dtype: torch.dtype | None,
                      tokenizer: Any) -> HFDirectorySink:
    """A sink writing ``model``'s export to ``out_dir`` with its config, architecture name,
    generation config and ``tokenizer`` (``dtype`` None: the trained dtype)."""
    return HFDirectorySink(out_dir, config=model.config,
                           dtype=dtype or next(model.parameters()).dtype,
                           architecture=type(meta_skeleton(model)).__name__,
                           generation_config=getattr(model, "generation_config", None),
                           tokenizer=tokenizer)


def export_model_to_hf(model: torch.nn.Module, out_dir: Path, *, export_cfg: Any,
                       tokenizer: Any, is_main: bool) -> ExportStats:
    """Stream the live model into ``out_dir`` (call on every rank; rank 0 writes)."""
    dtype = resolve_dtype(export_cfg.dtype, model)
    device = next(model.parameters()).device
    exporter = WeightExporter(model, bucket_bytes=default_bucket_bytes(export_cfg.bucket_mb, device),
                              dtype=dtype, delta=False, is_main=is_main)
    sink = hf_directory_sink(model, out_dir, dtype=dtype, tokenizer=tokenizer) if is_main else None
    return exporter.export(sink)


def export_checkpoint_to_hf(ckpt: Path, out_dir: Path, *, dtype_name: str) -> int:
    """Convert a Graft checkpoint into a HF directory in one process; returns the tensor count."""
    from graft.checkpoint.reader import load_tensors
    from graft.config import compose
    from graft.data.tokenizer import load_tokenizer
    from graft.models.build import build_skeleton

    # One process reads the whole checkpoint: how the run was parallelized does not matter here.
    cfg = compose(["engine.ep_size=1"], config_files=[ckpt / "config.yaml"])
    skeleton = build_skeleton(cfg.model)
    tensors = load_tensors(ckpt)
    dtype = resolve_dtype(dtype_name, skeleton)
    ctx = ExportContext(skeleton, skeleton.config.model_type, skeleton, dtype)
    sink = HFDirectorySink(out_dir, config=skeleton.config, architecture=type(skeleton).__name__,
                           dtype=dtype or next(iter(tensors.values())).dtype,
                           generation_config=getattr(skeleton, "generation_config", None),
                           tokenizer=load_tokenizer(cfg.data.tokenizer, cfg.model.path))
    sink.begin()
    count = 0
    try:
        for name, tensor in tensors.items():
            if dtype is not None and tensor.is_floating_point():
                tensor = tensor.to(dtype)
            pairs = export_slots(name, tensor, ctx)
            sink.consume(pairs)
            count += len(pairs)
        sink.finish()
    except BaseException as error:
        sink.abort(error)
        raise
    return count
