"""``graft export`` by rebuilding the run's model: for a checkpoint that holds only part of the
model (a plugin left out what it rebuilds, ``graft_ckpt_save``) or a plugin's format
(``graft_export_formats``).

The model is built in this process as the run built it (the checkpoint's config: its seed or
``model.path``, every plugin's ``graft_pre_shard``), the checkpoint's model entries are read
into it, and it is exported as a live model is: the Hugging Face directory through the export
stream (plugins' ``graft_export_entries`` apply, e.g. merged adapters), another format by its
plugin's writer.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from graft.errors import ConfigError
from graft.plugins import get_plugin_manager
from graft.plugins.registry import collect_named

HF_FORMAT = "hf"


def export_formats() -> dict[str, Any]:
    """``{name: writer}``: the plugins' formats (``graft_export_formats``)."""
    return collect_named(get_plugin_manager(), "graft_export_formats", "export format")


def export_rebuilt(ckpt: Path, out_dir: Path, *, fmt: str, dtype_name: str,
                   protected: Mapping[str, Path], force: bool = False) -> int:
    """Rebuild the run of checkpoint ``ckpt`` in this process (CPU, one rank), read its model
    entries, and write ``out_dir`` in format ``fmt`` (``hf``, or a plugin's). ``out_dir`` must
    already be checked (`graft.output_dirs.check_output_dir` with ``protected`` and
    ``force``). Returns the count of tensors a ``hf`` export wrote (0 for other formats)."""
    import dataclasses

    from graft import __version__
    from graft.checkpoint.reader import load_tensors
    from graft.config import compose
    from graft.data.tokenizer import load_tokenizer
    from graft.engine.distributed.env import init_distributed, shutdown_distributed
    from graft.engine.distributed.parallelize import build_parallel_model
    from graft.export.hf import damaged_advice, export_model_to_hf
    from graft.output_dirs import write_folder

    writers = export_formats()
    if fmt != HF_FORMAT and fmt not in writers:
        raise ConfigError(f"graft export --format {fmt}: no such format; the installed ones: "
                          f"{', '.join(sorted([HF_FORMAT, *writers]))}")
    cfg = compose(["engine.ep_size=1", "engine.device=cpu"], config_files=[ckpt / "config.yaml"])
    env = init_distributed(device_preference="cpu")
    try:
        model, _ = build_parallel_model(env, cfg=cfg)
        _read_model_entries(model, load_tensors(ckpt, note=damaged_advice(ckpt)))
        if fmt == HF_FORMAT:
            export_cfg = dataclasses.replace(cfg.export, dtype=dtype_name)
            stats = export_model_to_hf(model, out_dir, export_cfg=export_cfg, is_main=True,
                                       tokenizer=load_tokenizer(cfg.data.tokenizer,
                                                                cfg.model.path),
                                       protected=protected, label="--out", force=force)
            return stats.tensors
        write_folder(out_dir, lambda folder: writers[fmt](model=model, out_dir=folder, cfg=cfg),
                     written_by=f"graft {__version__}", protected=protected, force=force,
                     label="--out")
        return 0
    finally:
        shutdown_distributed()


def _read_model_entries(model: Any, tensors: dict[str, Any]) -> None:
    """Load ``tensors`` (a checkpoint's model entries, by name) into ``model``; the entries the
    checkpoint left out keep the values the build gave them."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, tensors, options=StateDictOptions(full_state_dict=True,
                                                                  strict=False))
