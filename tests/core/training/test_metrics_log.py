"""metrics.jsonl is strict JSON (a non-finite number is null, named in ``nonfinite``), and a step
line in a file or a pipe says ``N/total`` and the time left."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from graft.training.metrics import MetricsLog


def strict(line: str) -> dict:
    """``line`` parsed as JSON proper: NaN, Infinity and -Infinity are errors, as in jq."""

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(line, parse_constant=refuse)


def test_non_finite_values_are_null_and_named(tmp_path: Path) -> None:
    with MetricsLog(tmp_path, total_steps=2, enabled=True) as log:
        log.log({"step": 1, "loss": math.nan, "grad_norm": math.inf, "lr": 0.001,
                 "per_group": [1.0, -math.inf]}, print_line=False)
        log.log({"step": 2, "loss": 0.5}, print_line=False)
    first, second = (strict(line) for line in (tmp_path / "metrics.jsonl").open())
    assert first == {"step": 1, "loss": None, "grad_norm": None, "lr": 0.001,
                     "per_group": [1.0, None],
                     "nonfinite": {"loss": "nan", "grad_norm": "inf", "per_group.1": "-inf"}}
    assert second == {"step": 2, "loss": 0.5}
    assert math.isnan(log.history[0]["loss"]), "what fit returns keeps the numbers"


def test_piped_step_lines_say_the_step_of_the_total_and_the_time_left(tmp_path: Path,
                                                                       capsys) -> None:
    with MetricsLog(tmp_path, total_steps=10, enabled=True) as log:
        for step in (1, 9, 10):
            log.log({"step": step, "loss": 1.0})
    lines = capsys.readouterr().out.splitlines()
    assert [re.match(r"step +(\S+)  loss 1(  |$)", line)[1] for line in lines] == [
        "1/10", "9/10", "10/10"], lines
    assert all(re.search(r"  eta \d+:\d\d:\d\d$", line) for line in lines[:2]), lines
    assert "eta" not in lines[2], "none after the last step"
