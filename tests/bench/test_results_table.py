"""bench/results_table.py: the table of current results in bench/README.md is the one the result
files give, every number in it read from a result file."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
_spec = importlib.util.spec_from_file_location("results_table", BENCH / "results_table.py")
table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(table)

REGENERATE = "python3 bench/results_table.py"


def test_the_committed_table_is_current() -> None:
    readme = (BENCH / "README.md").read_text()
    assert readme == table.with_table(readme, table.markdown()), (
        f"bench/README.md's results table is not what bench/results/ gives: run {REGENERATE} "
        "(and commit bench/README.md)")


def test_every_row_names_an_existing_result_file_once() -> None:
    rows = table.rows()
    files = [row[4].split("](")[1].rstrip(")") for row in rows]
    assert len(files) == len(set(files)) >= 15
    assert all((BENCH / name).is_file() for name in files), files


def result(**fields) -> dict:
    base = {"measures": "a step", "device": "NVIDIA H200", "date": "2026-12-01",
            "command": "bench/step.py --out /root/out/results/step.json",
            "rows": [{"variant": "graft", "tokens_per_s": 17886},
                     {"variant": "plain", "tokens_per_s": 15778}],
            "headline": "{rows[variant=graft].tokens_per_s:,} tok/s vs {rows[variant=plain].tokens_per_s:,}"}
    return {**base, **fields}


def folder(tmp_path: Path, **files: dict) -> tuple[Path, Path]:
    results = tmp_path / "results"
    results.mkdir()
    for name, data in files.items():
        (results / f"{name}.json").write_text(json.dumps(data))
    readme = tmp_path / "README.md"
    readme.write_text(f"# Benchmarks\n\n{table.START}\n{table.END}\n\nafter\n")
    return results, readme


def test_a_row_reads_its_numbers_from_the_file(tmp_path: Path) -> None:
    results, _ = folder(tmp_path, step=result(), superseded={"rows": []})
    (row,) = table.rows(results)
    assert row == ["a step", "NVIDIA H200", "2026-12-01",
                   "`python3 bench/step.py --out $OUT/results/step.json`",
                   "[`results/step.json`](results/step.json)", "17,886 tok/s vs 15,778"]


def test_the_check_fails_when_a_result_changes_and_passes_once_regenerated(tmp_path, capsys) -> None:
    results, readme = folder(tmp_path, step=result())
    assert table.main(["--readme", str(readme), "--results", str(results)]) == 0
    assert "17,886 tok/s" in readme.read_text() and readme.read_text().endswith("\nafter\n")
    assert table.main(["--check", "--readme", str(readme), "--results", str(results)]) == 0

    data = result()
    data["rows"][0]["tokens_per_s"] = 18000
    (results / "step.json").write_text(json.dumps(data))
    assert table.main(["--check", "--readme", str(readme), "--results", str(results)]) == 1
    assert REGENERATE in capsys.readouterr().out


def test_a_headline_from_another_file_and_by_several_keys(tmp_path: Path) -> None:
    peer = {"fits": [{"variant": "today", "tokens": 8192, "largest": 159744},
                     {"variant": "today", "tokens": 32768, "largest": 1}]}
    step = result(headline="{peer.json#fits[variant=today&tokens=8192].largest:,}")
    results, _ = folder(tmp_path, step=step, peer=peer)
    (row,) = table.rows(results)
    assert row[-1] == "159,744"


@pytest.mark.parametrize(("fields", "message"), [
    ({"device": None, "date": None}, "no date"),
    ({"headline": "{rows[variant=missing].tokens_per_s}"}, "0 elements match"),
    ({"headline": "{rows.5.tokens_per_s}"}, "IndexError"),
])
def test_a_row_that_cannot_be_filled_names_its_file(tmp_path, fields, message) -> None:
    data = {key: value for key, value in result(**fields).items() if value is not None}
    results, _ = folder(tmp_path, step=data)
    with pytest.raises(ValueError, match=message) as error:
        table.rows(results)
    assert "step.json" in str(error.value)

