"""Reading dataset files (JSONL and Parquet) into records, with errors that point at the line.

Parquet columns come back as Python values: a struct column (verl's ``reward_model``,
``extra_info``) as a dict, a list column (chat messages) as a list of dicts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graft.errors import ConfigError, DataError

if TYPE_CHECKING:
    from graft.config.schema import DataConfig


@dataclass(frozen=True)
class Record:
    """One record of a dataset file and where it is: ``"<file>, line <N>"`` or ``", row <N>"``."""

    location: str
    fields: dict[str, Any]


SUFFIXES = (".jsonl", ".parquet")


def training_file(data: DataConfig) -> str | None:
    """``data.path`` when ``data.source=file`` (then it must be set), else None (a task)."""
    if data.source != "file":
        return None
    if not data.path:
        raise ConfigError("data.source=file needs data.path (a .jsonl or .parquet file)")
    return data.path


def dataset_file(path: str, setting: str = "data.path") -> Path:
    """The dataset file ``path`` (from the config key ``setting``), checked without reading
    it: it exists, is a readable file, and is ``.jsonl`` or ``.parquet``.

    Cheap: ``graft train`` checks it before launching ranks.
    """
    file = Path(path).expanduser()
    if file.is_dir():
        raise DataError(f"dataset file {path!r} is a directory ({setting}); give a .jsonl or "
                        f".parquet file")
    if not file.is_file():
        raise DataError(f"dataset file {path!r} does not exist ({setting})")
    if file.suffix not in SUFFIXES:
        raise DataError(f"dataset file {path!r}: unsupported extension {file.suffix!r}; use "
                        f".jsonl or .parquet")
    try:
        with file.open("rb") as handle:
            handle.read(1)
    except OSError as exc:
        raise DataError(f"dataset file {path!r} cannot be read ({setting}): "
                        f"{exc.strerror or exc}") from exc
    return file


def read_records(path: str, setting: str = "data.path") -> list[Record]:
    """Every record of a ``.jsonl`` or ``.parquet`` file, with its 1-based line or row;
    ``setting`` names the config key that gave ``path`` in errors."""
    file = dataset_file(path, setting)
    if file.suffix == ".jsonl":
        return _read_jsonl(file)
    import pyarrow.parquet as pq  # the other suffix `dataset_file` allows

    try:
        rows = pq.read_table(file).to_pylist()
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many error types
        raise DataError(f"dataset file {path!r} is not a readable Parquet file: {exc}") from exc
    if not rows:
        raise DataError(f"dataset file {file} holds no records")
    return [Record(f"{file}, row {number}", row) for number, row in enumerate(rows, start=1)]


def _read_jsonl(file: Path) -> list[Record]:
    records = []
    with file.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{file}, line {number}: not valid JSON ({exc.msg} at column "
                                f"{exc.colno})") from exc
            if not isinstance(record, dict):
                raise DataError(f"{file}, line {number}: expected a JSON object, got "
                                f"{type(record).__name__}")
            records.append(Record(f"{file}, line {number}", record))
    if not records:
        raise DataError(f"dataset file {file} holds no records")
    return records
