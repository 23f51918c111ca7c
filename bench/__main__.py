"""`python -m bench calibrate|overload ...`: see `bench.cli`."""

import sys

from bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
