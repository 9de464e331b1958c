"""Reading dataset files (JSONL and Parquet) into records, with errors that point at the line.

Parquet columns come back as Python values: a struct column (verl's ``reward_model``,
``extra_info``) as a dict, a list column (chat messages) as a list of dicts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graft.errors import DataError


@dataclass(frozen=True)
class Record:
    """One record of a dataset file and where it is: ``"<file>, line <N>"`` or ``", row <N>"``."""

    location: str
    fields: dict[str, Any]


def read_records(path: str, setting: str = "data.path") -> list[Record]:
    """Every record of a ``.jsonl`` or ``.parquet`` file, with its 1-based line or row;
    ``setting`` names the config key that gave ``path`` in errors."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise DataError(f"dataset file {path!r} does not exist ({setting})")
    if file.suffix == ".jsonl":
        return _read_jsonl(file)
    if file.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(file).to_pylist()
        except Exception as exc:  # noqa: BLE001 - pyarrow raises many error types
            raise DataError(f"dataset file {path!r} is not a readable Parquet file: {exc}") from exc
        if not rows:
            raise DataError(f"dataset file {file} holds no records")
        return [Record(f"{file}, row {number}", row) for number, row in enumerate(rows, start=1)]
    raise DataError(f"dataset file {path!r}: unsupported extension {file.suffix!r}; use .jsonl "
                    f"or .parquet")


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
