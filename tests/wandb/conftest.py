"""W&B in offline mode, kept in the test's folders, and a reader of the runs it wrote."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# wandb's transaction log (run-ID.wandb): LevelDB's log format behind a 7-byte header (":W&B",
# a magic number, a version), in 32 KiB blocks of records (a crc32, a length, a type: a whole
# message, or its first, middle or last piece), each message a wandb_internal_pb2.Record.
# wandb 0.31 has no Python reader of it (its Go core reads it), so the tests read it here.
HEADER = struct.Struct("<4sHB")
RECORD = struct.Struct("<IHB")
BLOCK = 32768
WHOLE, LAST = 1, 4


@pytest.fixture(autouse=True)
def wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_env: None) -> None:
    """W&B offline, its settings and caches in the test's folder, nothing sent anywhere."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home" / name.lower()))
    for name in ("WANDB_DIR", "WANDB_API_KEY", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_RUN_ID",
                 "WANDB_RESUME"):
        monkeypatch.delenv(name, raising=False)


def records(path: Path) -> Iterator[Any]:
    """The `wandb_internal_pb2.Record` messages of the transaction log ``path``, in order."""
    from wandb.proto.wandb_internal_pb2 import Record

    data = path.read_bytes()
    assert HEADER.unpack_from(data)[0] == b":W&B", f"{path} is not a W&B transaction log"
    position, message = HEADER.size, b""
    while position + RECORD.size <= len(data):
        if BLOCK - position % BLOCK < RECORD.size:  # a block's tail too short for a header
            position += BLOCK - position % BLOCK
            continue
        _, length, kind = RECORD.unpack_from(data, position)
        if kind == 0:  # zero padding: the end of what was written
            break
        start = position + RECORD.size
        message += data[start:start + length]
        position = start + length
        if kind in (WHOLE, LAST):
            record = Record()
            record.ParseFromString(message)
            message = b""
            yield record


def wandb_run(path: Path) -> dict[str, Any]:
    """What one offline run (segment) holds: its id, name, config and history rows."""
    run: dict[str, Any] = {"config": {}, "history": []}
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.update(id=record.run.run_id, name=record.run.display_name,
                       project=record.run.project,
                       tags=list(record.run.tags), started=record.run.start_time.ToNanoseconds())
            run["config"].update(_items(record.run.config.update))
        elif kind == "config":
            run["config"].update(_items(record.config.update))
        elif kind == "history":
            run["history"].append(_items(record.history.item))
    return run


def _items(items: Any) -> dict[str, Any]:
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}


@pytest.fixture
def wandb_runs() -> Callable[[Path], list[dict[str, Any]]]:
    """The offline runs W&B wrote under ``<run_dir>/wandb``, oldest first (a resumed run
    writes one more, with the same id)."""

    def read(run_dir: Path) -> list[dict[str, Any]]:
        logs = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
        return sorted((wandb_run(log) for log in logs), key=lambda run: run["started"])

    return read
