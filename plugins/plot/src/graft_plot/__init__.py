"""graft-plot: ``graft plot RUN_DIR [RUN_DIR ...] [--out DIR]``, PNGs of training curves from
runs' ``metrics.jsonl`` (entry point ``plot``; no config section).

- `graft_plot.plugin`: where the plugin touches Graft's core (``graft_cli_commands``);
- `graft_plot.curves`: the command (`add_parser`, `run`), what it reads (`read_metrics`,
  `curve_series`) and draws (`draw`, with matplotlib, imported when a plot is drawn).

Importing this package is cheap (no matplotlib, no torch).
"""

from graft_plot.curves import CURVES, Series, curve_series, draw, read_metrics

__version__ = "0.1.0"

__all__ = ["CURVES", "Series", "__version__", "curve_series", "draw", "read_metrics"]
