"""The ``graft`` command line. Each subcommand lives in its own module with ``add_parser``/``run``."""

import time

# When the command started (time.monotonic): the first Python code of `graft` and
# `python -m graft` after the interpreter's own start-up, for time_to_first_step_s. The kernel's
# start time of the process is no use there: a shell that runs `exec graft` passes on its own.
STARTED = time.monotonic()
