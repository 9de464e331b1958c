"""Exporting to a Hugging Face directory: from the live (sharded) model, or from a checkpoint."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from graft.export.context import ExportContext
from graft.export.handlers import export_slots, meta_skeleton
from graft.export.sinks.hf_dir import HFDirectorySink
from graft.export.stream import ExportStats, WeightExporter, default_bucket_bytes, resolve_dtype
from graft.output_dirs import check_output_dir


def hf_directory_sink(model: torch.nn.Module, out_dir: Path, *, dtype: torch.dtype | None,
                      tokenizer: Any, protected: Mapping[str, Path] | None = None,
                      force: bool = False) -> HFDirectorySink:
    """A sink writing ``model``'s export to ``out_dir`` with its config, architecture name,
    generation config and ``tokenizer`` (``dtype`` None: the trained dtype); ``protected`` and
    ``force`` as in `check_output_dir`."""
    return HFDirectorySink(out_dir, config=model.config,
                           dtype=dtype or next(model.parameters()).dtype,
                           architecture=type(meta_skeleton(model)).__name__,
                           generation_config=getattr(model, "generation_config", None),
                           tokenizer=tokenizer, protected=protected, force=force)


def export_model_to_hf(model: torch.nn.Module, out_dir: Path, *, export_cfg: Any,
                       tokenizer: Any, is_main: bool, protected: Mapping[str, Path] | None = None,
                       label: str = "the export folder", hint: str | None = None,
                       group: Any = None, force: bool = False) -> ExportStats:
    """Stream the live model into ``out_dir`` (call on every rank of ``group``, default all;
    rank 0 writes).

    Every rank first checks that ``out_dir`` may be replaced (`check_output_dir` with
    ``protected``; ``label`` names it and ``hint`` says what else to do), so a
    refused target stops all ranks before the collective export starts (``force`` as there).
    """
    check_output_dir(out_dir, protected=protected, force=force, label=label, hint=hint)
    dtype = resolve_dtype(export_cfg.dtype, model)
    device = next(model.parameters()).device
    exporter = WeightExporter(model, bucket_bytes=default_bucket_bytes(export_cfg.bucket_mb, device),
                              dtype=dtype, is_main=is_main, group=group)
    sink = (hf_directory_sink(model, out_dir, dtype=dtype, tokenizer=tokenizer,
                              protected=protected, force=force) if is_main else None)
    return exporter.export(sink)


def export_checkpoint_to_hf(ckpt: Path, out_dir: Path, *, dtype_name: str, force: bool = False,
                           label: str = "the export folder", hint: str | None = None) -> int:
    """Convert a Graft checkpoint into a HF directory in one process; returns the tensor count.

    Before reading anything: ``out_dir`` must be replaceable (`check_output_dir`, with the
    checkpoint and its run directory protected; ``force``, ``label`` and ``hint`` are
    passed on) and every file of the checkpoint must have the size its manifest says. A
    checkpoint holding only part of the model (a plugin left the rest out, ``graft_ckpt_save``)
    is exported by rebuilding the run's model (`graft.export.rebuilt.export_rebuilt`).
    """
    from graft.checkpoint.manifest import verify_files
    from graft.checkpoint.reader import load_tensors, run_dir_of
    from graft.config import compose
    from graft.data.tokenizer import load_tokenizer
    from graft.models.build import build_skeleton

    protected = {"the checkpoint": ckpt, **({"the run directory": run}
                                            if (run := run_dir_of(ckpt)) is not None else {})}
    check_output_dir(out_dir, protected=protected, force=force, label=label, hint=hint)
    verify_files(ckpt, checksums=False, advice=damaged_advice(ckpt))
    # One process reads the whole checkpoint: how the run was parallelized does not matter here.
    cfg = compose(["engine.ep_size=1"], config_files=[ckpt / "config.yaml"])
    skeleton = build_skeleton(cfg.model)
    tensors = load_tensors(ckpt, note=damaged_advice(ckpt))
    if any(name not in tensors for name in skeleton.state_dict()):
        # a plugin left part of the model out (graft_ckpt_save): rebuild it as the run did
        from graft.export.rebuilt import HF_FORMAT, export_rebuilt

        return export_rebuilt(ckpt, out_dir, fmt=HF_FORMAT, dtype_name=dtype_name,
                              protected=protected, force=force)
    dtype = resolve_dtype(dtype_name, skeleton)
    ctx = ExportContext(skeleton, skeleton.config.model_type, skeleton, dtype)
    sink = HFDirectorySink(out_dir, config=skeleton.config, architecture=type(skeleton).__name__,
                           dtype=dtype or next(iter(tensors.values())).dtype,
                           generation_config=getattr(skeleton, "generation_config", None),
                           tokenizer=load_tokenizer(cfg.data.tokenizer, cfg.model.path),
                           protected=protected, force=force)
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


def damaged_advice(ckpt: Path) -> str:
    """What to do when checkpoint ``ckpt`` cannot be read for an export."""
    return (f"`graft ckpt verify {ckpt}` checks every file; export another checkpoint "
            f"(another step_<N> folder of the run) or retrain")
