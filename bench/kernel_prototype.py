"""The command line the kernel prototypes (``exact_*.py`` here) share: ``--interpret`` runs
their CPU check (under ``TRITON_INTERPRET=1``), otherwise they measure on the GPU and write
``--out`` with the date, the command and the GPU."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import torch


def prototype_main(description: str, *, check: Callable[[], None],
                   measure: Callable[[torch.device], list[dict[str, Any]]],
                   settings: dict[str, Any]) -> None:
    """Parse the command line and run ``check`` (``--interpret``, prints OK) or ``measure``
    on the GPU, writing its rows and ``settings`` to ``--out``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", default=None)
    parser.add_argument("--interpret", action="store_true",
                        help="check on CPU (run with TRITON_INTERPRET=1)")
    args = parser.parse_args()
    if args.interpret:
        check()
        print("OK")
        return
    if args.out is None:
        parser.error("--out is required to measure on the GPU")
    device = torch.device("cuda")
    result = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
              "gpu": torch.cuda.get_device_name(device), **settings, "rows": measure(device)}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
