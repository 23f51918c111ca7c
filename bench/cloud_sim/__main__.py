"""`python -m bench.cloud_sim --port N ...`: the cloud simulator without the spillover CLI."""

from __future__ import annotations

import argparse
import sys

from bench.cloud_sim.cli import add_cloud_sim_arguments, run_cloud_sim


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cloud_sim", description="fake OpenAI-compatible cloud API")
    add_cloud_sim_arguments(parser)
    try:
        return run_cloud_sim(parser.parse_args(argv))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
