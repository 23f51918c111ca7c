"""`python -m spillover ...` is `spillover ...`."""

from spillover.main import main

raise SystemExit(main())
