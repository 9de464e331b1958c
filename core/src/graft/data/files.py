"""Reading prompt/response datasets from JSONL and Parquet, with errors that point at the line."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graft.data.tasks import TextSample
from graft.errors import DataError


@dataclass(frozen=True)
class Record:
    """One record of a dataset file and where it is: ``"<file>, line <N>"`` or ``", row <N>"``."""

    location: str
    fields: dict[str, Any]


def read_records(path: str) -> list[Record]:
    """Every record of a ``.jsonl`` or ``.parquet`` file, with its 1-based line or row."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise DataError(f"dataset file {path!r} does not exist (data.path)")
    if file.suffix == ".jsonl":
        return _read_jsonl(file)
    if file.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(file).to_pylist()
        except Exception as exc:  # noqa: BLE001 - pyarrow raises many error types
            raise DataError(f"dataset file {path!r} is not a readable Parquet file: {exc}") from exc
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


def records_to_samples(records: list[Record], *, prompt_key: str,
                       response_key: str, answer_key: str,
                       require_response: bool) -> list[TextSample]:
    """Pick the configured columns; a missing column names the record, its line and its keys.

    The answer defaults to the response when the answer column is absent. Each sample's
    ``origin`` is its record's location.
    """
    needed = [prompt_key] + ([response_key] if require_response else [])
    samples = []
    for number, record in enumerate(records, start=1):
        fields = record.fields
        missing = [key for key in needed if key not in fields]
        if missing:
            raise DataError(f"{record.location}: record {number} has no {missing[0]!r} field (it "
                            f"has: {', '.join(map(str, fields))}); set data.prompt_key / "
                            f"data.response_key to the dataset's column names")
        response = str(fields.get(response_key, ""))
        samples.append(TextSample(str(fields[prompt_key]), response,
                                  str(fields.get(answer_key, response)), origin=record.location))
    return samples
