"""``python -m graft_calculator PATH --count N``: write arithmetic problems as Graft JSONL
(`graft_calculator.problems.main`)."""

from graft_calculator.problems import main

raise SystemExit(main())
