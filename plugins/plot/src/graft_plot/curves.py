"""``graft plot RUN_DIR [RUN_DIR ...] [--out DIR]``: PNGs of training curves (matplotlib) from
each run's ``metrics.jsonl``, one per quantity, the runs overlaid to compare them.

A quantity no run logged (KL without ``loss.kl_coef``, validation without ``data.val_path``)
gets no PNG, and the command says so. The PNGs go into a folder replaced whole, as Graft's
exports are (`graft.output_dirs.write_folder`): a folder of files Graft did not write is
refused.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
from pathlib import Path
from typing import Any, NamedTuple

from graft.errors import ConfigError, DataError

# (PNG name, title, the metrics.jsonl keys drawn: names or fnmatch patterns)
CURVES = (
    ("reward", "reward (mean over the step's samples)", ("reward_mean",)),
    ("validation", "validation (held-out set)", ("val/reward_mean", "val/pass@*", "val/loss")),
    ("loss", "loss", ("loss",)),
    ("kl", "KL (to the reference: kl; to the policy before the update: approx_kl)",
     ("kl", "approx_kl")),
    ("entropy", "entropy (nats per token)", ("entropy",)),
    ("response_length", "response length (tokens, mean)",
     ("response_length", "val/response_length")),
    ("mismatch", "trainer vs rollout log-prob mismatch (train_infer_logprob_diff)",
     ("train_infer_logprob_diff",)),
    ("throughput", "throughput (tokens/s)", ("tokens_per_s", "rollout_tokens_per_s")),
)
OUT_NAME = "plots"
LINE_STYLES = ("-", "--", ":", "-.")


def add_parser(subparsers: Any) -> None:
    """Register the ``plot`` subcommand."""
    parser = subparsers.add_parser(
        "plot", help="PNGs of training curves from runs' metrics.jsonl",
        description="Write PNGs of reward, validation, loss, KL, entropy, response length, "
                    "mismatch and throughput against the step, from each run's metrics.jsonl; "
                    "several runs are drawn together, named by their directory.")
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                        help="a run directory (trainer.run_dir) holding metrics.jsonl")
    parser.add_argument("--out", metavar="DIR",
                        help=f"where the PNGs go (default: RUN_DIR/{OUT_NAME} for one run; "
                             f"needed for several): new, empty, or a folder graft plot wrote "
                             f"(replaced whole)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Read every run's metrics, draw the curves present, say what was written and skipped."""
    from graft.output_dirs import write_folder

    histories = {name.rstrip("/") or name: read_metrics(Path(name)) for name in args.run_dirs}
    if args.out is None and len(histories) > 1:
        raise ConfigError(f"graft plot of {len(histories)} runs needs --out DIR: where the PNGs "
                          f"comparing them go")
    out = Path(args.out) if args.out is not None else Path(args.run_dirs[0]) / OUT_NAME
    figure_class = _figure_class()
    drawn = {name: series for name, _, keys in CURVES
             if (series := curve_series(histories, keys))}
    titles = {name: title for name, title, _ in CURVES}

    def write(folder: Path) -> None:
        for name, series in drawn.items():
            draw(figure_class, titles[name], series).savefig(folder / f"{name}.png")

    runs = {f"the run directory {name}": Path(name) for name in histories}
    write_folder(out, write, written_by="graft plot", protected=runs, label="--out")
    print(f"wrote {len(drawn)} PNGs to {out}: {', '.join(f'{n}.png' for n in drawn)}")
    skipped = [f"{name} ({', '.join(keys)})" for name, _, keys in CURVES if name not in drawn]
    if skipped:
        print(f"skipped, no run logged them: {'; '.join(skipped)}")
    return 0


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The records of ``run_dir/metrics.jsonl`` (a last line being written is left out);
    `DataError` when there is none or a line is not JSON."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        what = "does not exist" if not run_dir.exists() else "holds no metrics.jsonl"
        raise DataError(f"{run_dir} {what}: give the trainer.run_dir of a run that trained at "
                        f"least one step")
    lines = path.read_text().splitlines()
    records = []
    for number, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except ValueError as exc:
            if number < len(lines):  # the last line may be half written by a running run
                raise DataError(f"{path}:{number} is not a JSON line ({exc}); metrics.jsonl "
                                f"holds one JSON object per step, as graft train writes it") from exc
    if not records:
        raise DataError(f"{path} holds no step yet: plot it once the run has logged a step")
    return records


class Series(NamedTuple):
    """One line of a plot: ``key``'s values of the run ``run`` at its steps."""

    run: int  # the run's place on the command line (its colour)
    key: int  # the key's place among the plot's keys (its line style)
    steps: list[int]
    values: list[float]


def curve_series(histories: dict[str, list[dict[str, Any]]], keys: tuple[str, ...]
                 ) -> dict[str, Series]:
    """``{label: Series}`` of every key matching ``keys`` (names or `fnmatch` patterns) that
    some run logged as a number; a label is the run's name, followed by the key when a plot
    draws several keys. Records without the key, or with it null (a non-finite value), leave
    a gap."""
    names = sorted({key for history in histories.values() for record in history
                    for key in record if _wanted(key, keys)},
                   key=lambda key: (min(i for i, k in enumerate(keys) if _wanted(key, (k,))), key))
    series: dict[str, Series] = {}
    for run_index, (run_name, history) in enumerate(histories.items()):
        for key_index, key in enumerate(names):
            points = [(record["step"], float(record[key])) for record in history
                      if isinstance(record.get(key), (int, float)) and "step" in record]
            if points:
                label = run_name if len(names) == 1 else f"{run_name} {key}"
                series[label] = Series(run_index, key_index, [step for step, _ in points],
                                       [value for _, value in points])
    return series


def _wanted(key: str, keys: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in keys)


def draw(figure_class: Any, title: str, series: dict[str, Series]) -> Any:
    """A matplotlib figure of ``series`` against the step, with a legend naming each line:
    one colour a run, one line style a key."""
    figure = figure_class(figsize=(6.4, 3.6), dpi=80, layout="constrained")
    axes = figure.subplots()
    for label, line in series.items():
        axes.plot(line.steps, line.values, label=label, color=f"C{line.run % 10}",
                  linestyle=LINE_STYLES[line.key % len(LINE_STYLES)],
                  marker="o" if len(line.steps) <= 20 else None, markersize=3, linewidth=1.2)
    axes.set(title=title, xlabel="step")
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    return figure


def _figure_class() -> Any:
    """matplotlib's `Figure` (drawn with the Agg backend, no display, no pyplot state);
    `ConfigError` naming the pip command when matplotlib is not installed."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ConfigError(f"graft plot draws with matplotlib ({exc}): `pip install matplotlib`"
                          ) from exc
    return Figure
