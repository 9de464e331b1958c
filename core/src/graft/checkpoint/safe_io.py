"""Reading DCP checkpoints without letting them run code.

``torch.distributed.checkpoint`` unpickles ``.metadata`` with plain ``pickle`` and non-tensor
values with ``torch.load(weights_only=False)``: a crafted checkpoint could execute anything.
Graft reads the metadata with an unpickler that only rebuilds DCP's own metadata classes, and
non-tensor values with ``weights_only=True``. `dcp_failures` turns DCP's errors into a
`CheckpointError` for every caller that reads or writes shards.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from graft.errors import CheckpointError

_DCP_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
_ALLOWED = {("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PurePosixPath"),
            ("torch", "Size"), ("torch.serialization", "_get_layout"),
            ("collections", "OrderedDict")}


@contextmanager
def dcp_failures(action: str, *, note: str = "") -> Iterator[None]:
    """Around a DCP save or load: any failure becomes ``CheckpointError("<action> failed:
    <last line of the cause>. <note>")``; a `CheckpointError` passes unchanged.

    DCP raises `CheckpointException` (a BaseException, not an Exception) carrying every rank's
    traceback; only its last line is shown, the whole cause stays chained. A Ctrl-C that DCP
    caught on some rank is raised again as `KeyboardInterrupt`: the run was interrupted (the
    command says how to resume it), not broken.
    """
    try:
        yield
    except CheckpointError:
        raise
    except CheckpointException as exc:
        if any(isinstance(cause, KeyboardInterrupt) for cause, _ in exc.failures.values()):
            raise KeyboardInterrupt from exc
        raise _failed(action, note, exc) from exc
    except Exception as exc:  # noqa: BLE001 - reported with its cause
        raise _failed(action, note, exc) from exc


def _failed(action: str, note: str, exc: BaseException) -> CheckpointError:
    """``"<action> failed: <last line of exc>. <note>"``."""
    lines = str(exc).strip().splitlines()
    detail = lines[-1] if lines else type(exc).__name__  # some errors carry no message
    return CheckpointError(f"{action} failed: {detail}." + (f" {note}" if note else ""))


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED or module in _DCP_MODULES:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in checkpoint metadata")


def read_metadata(path: Path) -> Metadata:
    """Read ``<path>/.metadata`` with the restricted unpickler; `CheckpointError` naming the file."""
    file = path / ".metadata"
    if not file.is_file():
        raise CheckpointError(f"{file} is missing: {path} is not a complete DCP checkpoint")
    try:
        metadata = _MetadataUnpickler(io.BytesIO(file.read_bytes())).load()
    except Exception as exc:  # noqa: BLE001 - any decoding failure means a bad file
        raise CheckpointError(f"{file} is unreadable or corrupted: {exc}") from exc
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{file} does not hold DCP metadata")
    return metadata


class SafeFileSystemReader(FileSystemReader):
    """A `FileSystemReader` whose metadata comes from the restricted unpickler."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = read_metadata(Path(self.path))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """Loads non-tensor values (optimizer hyper-parameters) with ``weights_only=True``."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded
