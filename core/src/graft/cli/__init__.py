"""The ``graft`` command line. Each subcommand lives in its own module with ``add_parser``/``run``."""
