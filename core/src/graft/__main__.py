"""``python -m graft`` runs the ``graft`` CLI."""

from graft.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
