"""How ``graft train`` starts its processes: OpenMP's wait policy, torchrun, and rank errors.

``graft train --nproc N`` runs torchrun's launcher in its own process (`run_torchrun`). A rank
it started that fails with a `graft.errors.GraftError` records the message for the launcher
(`rank_errors_recorded`) instead of printing it, so the user reads it once, with the rank's
exit code, and without torchrun's ``ChildFailedError`` report (shown under ``GRAFT_DEBUG=1``).
A rank of a torchrun the user started directly prints its errors itself, as one process does.

Nothing here imports torch at module level: `use_short_openmp_spin` must run before torch loads.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from graft.errors import GraftError

# Set by `run_torchrun` for its ranks: the folder where a failing rank writes rank_<r>.json.
ERRORS_ENV = "GRAFT_RANK_ERRORS"
# libgomp's own spin count for a process with more OpenMP threads than cores (see below).
SHORT_SPIN = "100"


def use_short_openmp_spin() -> None:
    """Make OpenMP threads that wait for work spin briefly, then sleep: ``GOMP_SPINCOUNT=100``,
    unless ``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY`` is set. Call it before torch is imported.

    libgomp (torch's OpenMP on Linux) spins 300,000 times at each wait while a process has no
    more OpenMP threads than cores, and 100 times once it has more. The first checkpoint save
    adds threads (each of gloo's two worker threads starts its own OpenMP team), so training
    changed speed there: with the cores shared with other jobs, spinning threads took the time
    the working ones needed, and RL steps before the first save were several times slower than
    after it (see bench/README.md). With the short spin from the start every step runs as those
    after the save do.
    """
    if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = SHORT_SPIN


def _debug() -> bool:
    return os.environ.get("GRAFT_DEBUG") == "1"


def run_torchrun(torchrun_args: Sequence[str]) -> int:
    """Run torchrun's launcher here with ``torchrun_args`` (its command line, options then
    ``-m graft train ...``); return 0, or the exit code of the failed rank it reports.

    A rank's GraftError is printed once (``graft: error: ...``) and its exit code (2 for a
    config error) is returned; another failure names the rank and its exit code (its traceback
    is in the rank's own output). torchrun's report and log lines are shown under
    ``GRAFT_DEBUG=1`` only. Ctrl-C: torchrun passes the signal to the ranks, whose rank 0 says
    what rerunning does; the return value is 128 + the signal's number.
    """
    import torch.distributed.run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    if not _debug():
        _quiet_torchrun_logs()
    with tempfile.TemporaryDirectory(prefix="graft-rank-errors-") as folder:
        os.environ[ERRORS_ENV] = folder  # the ranks inherit the launcher's environment
        try:
            torchrun.run(torchrun.parse_args(list(torchrun_args)))
        except ChildFailedError as exc:
            if _debug():
                traceback.print_exc()
            return report_failed_ranks(exc.failures, Path(folder))
        except SignalException as exc:
            return 128 + int(exc.sigval)
        finally:
            os.environ.pop(ERRORS_ENV, None)
    return 0


def _quiet_torchrun_logs() -> None:
    # torchrun's modules give each of their loggers its own level (LOGLEVEL, else WARNING), so
    # a parent's level would not hold them: set it on each one its import created.
    for name in list(logging.Logger.manager.loggerDict):
        if name.startswith(("torch.distributed.elastic", "torch.distributed.run",
                            "torch.distributed.launcher")):
            logging.getLogger(name).setLevel(logging.CRITICAL)


def report_failed_ranks(failures: dict[int, Any], folder: Path) -> int:
    """Print the error the lowest failed rank recorded in ``folder`` (and which ranks recorded
    another) or, when none recorded one, the first failed rank and its exit code; return the
    exit code to exit with.

    ``failures`` maps global rank to torchrun's ``ProcessFailure`` (``exitcode``: the code, or
    minus the signal that ended the rank).
    """
    recorded = {rank: json.loads(path.read_text()) for rank in sorted(failures)
                if (path := folder / f"rank_{rank}.json").is_file()}
    if recorded:
        (first, entry), *others = recorded.items()
        print(f"graft: error: {entry['message']}", file=sys.stderr)
        other = [rank for rank, e in others if e["message"] != entry["message"]]
        if other:
            print(f"graft: rank {first}'s error; rank{'s' if len(other) > 1 else ''} "
                  f"{', '.join(map(str, other))} failed with another "
                  f"(GRAFT_DEBUG=1 prints every rank's)", file=sys.stderr)
        return int(entry["exit_code"])
    rank = min(failures, key=lambda r: failures[r].timestamp)
    code = _exit_code(failures[rank].exitcode)
    if code != 130:  # Ctrl-C: rank 0 said so already
        print(f"graft: error: rank {rank} failed with exit code {code} (its output above says "
              f"why; GRAFT_DEBUG=1 shows torchrun's report)", file=sys.stderr)
    return code


def _exit_code(exitcode: int) -> int:
    return exitcode if exitcode >= 0 else 128 - exitcode


@contextmanager
def rank_errors_recorded() -> Iterator[None]:
    """Around a rank's work under `run_torchrun`: a GraftError is written for the launcher
    (``GRAFT_DEBUG=1`` also prints its traceback here) and the rank exits with its exit code.
    Elsewhere (one process, or a torchrun the user started) it does nothing."""
    folder = os.environ.get(ERRORS_ENV)
    if folder is None or "LOCAL_RANK" not in os.environ:
        yield
        return
    try:
        yield
    except GraftError as exc:
        if _debug():
            traceback.print_exc()
        rank = int(os.environ.get("RANK", "0"))
        entry = {"message": str(exc), "exit_code": exc.exit_code}
        (Path(folder) / f"rank_{rank}.json").write_text(json.dumps(entry))
        from graft.engine.distributed.env import end_torchrun_worker

        end_torchrun_worker(exc.exit_code)
