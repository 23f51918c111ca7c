"""`python -m cli ...` is `spillover ...`."""

from cli.main import main

raise SystemExit(main())
