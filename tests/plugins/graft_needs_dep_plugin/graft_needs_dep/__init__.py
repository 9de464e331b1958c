"""A plugin whose dependency is missing: its module imports, its reward would fail in a worker."""
