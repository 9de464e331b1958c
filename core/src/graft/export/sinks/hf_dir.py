"""`HFDirectorySink`: a Hugging Face model directory that ``from_pretrained`` loads as is.

Sharded ``*.safetensors`` files with ``model.safetensors.index.json``, ``config.json``,
``generation_config.json``, the tokenizer when there is one, and `graft.output_dirs.MARKER`
(the files Graft wrote, so a later export may replace them). Everything is written into a
temporary folder that replaces the target at `finish`, so a failed export leaves the previous
directory untouched; `graft.output_dirs.check_output_dir` decides, at `begin` and again just
before the swap, whether the target may be replaced. Files get the umask's mode. Tensors are in
transformers' checkpoint layout (consumer ``hf``); the row blocks of an expert-parallel fused
tensor are assembled in host memory as they arrive.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from graft._version import __version__
from graft.checkpoint.layout import TMP_PREFIX, replace_dir
from graft.export.context import HF_LAYOUT
from graft.export.sinks.base import RowAssembler, RowBlock
from graft.output_dirs import check_output_dir, give_umask_modes, write_marker

INDEX = "model.safetensors.index.json"


class HFDirectorySink:
    """Writes an export to ``out_dir`` (replaced atomically).

    ``protected`` and ``force`` are `check_output_dir`'s: folders the target must not be or
    contain, and whether a folder Graft did not write may be replaced.
    """

    consumer = HF_LAYOUT

    def __init__(self, out_dir: str | Path, *, config: Any, architecture: str | None = None,
                 dtype: torch.dtype | None = None, generation_config: Any = None,
                 tokenizer: Any = None, max_shard_bytes: int = 5 << 30,
                 protected: Mapping[str, Path] | None = None, force: bool = False) -> None:
        self.out_dir = Path(out_dir)
        self.protected = dict(protected or {})
        self.force = force
        self.config = config
        self.architecture = architecture
        self.dtype = dtype
        self.generation_config = generation_config
        self.tokenizer = tokenizer
        self.max_shard_bytes = max_shard_bytes
        self._tmp: Path | None = None
        self._shard: dict[str, torch.Tensor] = {}
        self._shard_bytes = 0
        self._files: list[tuple[str, list[str]]] = []
        # name -> shape of every tensor of the last finished export (what a consumer loads).
        self.shapes: dict[str, tuple[int, ...]] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._rows = RowAssembler()

    def begin(self) -> None:
        """Check the target may be replaced; create the temporary folder next to it."""
        self.out_dir = self._checked_target()
        self.out_dir.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = self.out_dir.with_name(f"{TMP_PREFIX}{self.out_dir.name}-{uuid.uuid4().hex[:8]}")
        self._tmp.mkdir()
        self._shard, self._shard_bytes, self._files, self._shapes = {}, 0, [], {}
        self._rows.clear()

    def consume(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        """Copy tensors to CPU; write a shard whenever it reaches ``max_shard_bytes``."""
        for name, tensor in tensors:
            self._add(name, tensor.detach().to("cpu", copy=True).contiguous())

    def consume_rows(self, blocks: list[RowBlock]) -> None:
        """Assemble row blocks in host memory; a tensor joins the shard once whole."""
        for block in blocks:
            whole = self._rows.add(block)
            if whole is not None:
                self._add(block.name, whole)

    def _add(self, name: str, tensor: torch.Tensor) -> None:
        nbytes = tensor.numel() * tensor.element_size()
        if self._shard and self._shard_bytes + nbytes > self.max_shard_bytes:
            self._write_shard()
        self._shard[name] = tensor
        self._shard_bytes += nbytes
        self._shapes[name] = tuple(tensor.shape)

    def finish(self) -> None:
        """Name the shards, write index, config, generation config, tokenizer; swap in."""
        self._rows.check_complete()
        self._write_shard()
        count = len(self._files)
        weight_map = {}
        for index, (partial, names) in enumerate(self._files, start=1):
            final = "model.safetensors" if count == 1 else f"model-{index:05d}-of-{count:05d}.safetensors"
            os.replace(self._tmp / partial, self._tmp / final)
            weight_map.update({name: final for name in names})
        if count > 1:
            total = sum((self._tmp / f).stat().st_size for f in set(weight_map.values()))
            index_json = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
            (self._tmp / INDEX).write_text(json.dumps(index_json, indent=2))
        self._write_configs()
        give_umask_modes(self._tmp)
        write_marker(self._tmp, written_by=f"graft {__version__}")
        replace_dir(self._tmp, self._checked_target())
        self._tmp = None
        self.shapes = self._shapes

    def _checked_target(self) -> Path:
        return check_output_dir(self.out_dir, protected=self.protected, force=self.force,
                                label="the export folder")

    def abort(self, error: BaseException) -> None:
        """Remove the temporary folder; the previous export (if any) stays."""
        self._rows.clear()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def _write_shard(self) -> None:
        if not self._shard:
            return
        name = f"partial-{len(self._files):05d}.safetensors"
        save_file(self._shard, str(self._tmp / name), metadata={"format": "pt"})
        self._files.append((name, list(self._shard)))
        self._shard, self._shard_bytes = {}, 0

    def _write_configs(self) -> None:
        config = copy.deepcopy(self.config)
        config.use_cache = True  # trained with the cache off; inference wants it
        if self.architecture and not getattr(config, "architectures", None):
            config.architectures = [self.architecture]  # what vLLM picks its model class by
        if self.dtype is not None:
            config.dtype = str(self.dtype).removeprefix("torch.")
        config.save_pretrained(self._tmp)
        if self.generation_config is not None:
            self.generation_config.save_pretrained(self._tmp)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(self._tmp)
