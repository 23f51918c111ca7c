"""`spillover cloud-sim` flags (bench/cloud_sim/cli.py): they become the simulator's settings, and
bad combinations are refused naming the problem."""

from __future__ import annotations

import argparse

import pytest

from bench.cloud_sim import InvalidSettings, SimSettings, add_cloud_sim_parser
from bench.cloud_sim.cli import settings_from_args


def test_cli_flags_become_settings() -> None:
    parser = argparse.ArgumentParser()
    add_cloud_sim_parser(parser.add_subparsers(dest="command"))
    flags = "--port 0 --models a,b --ttft-s 0.1 --max-concurrency 3 --rate-limit-rate 0.25 --api-key-env SIM_KEY"
    args = parser.parse_args(["cloud-sim", *flags.split(), "--log", "x.jsonl"])
    settings = settings_from_args(args, env={"SIM_KEY": "k"})
    assert args.func.__name__ == "run_cloud_sim" and args.log == "x.jsonl"
    assert settings.models == ("a", "b") and settings.ttft_s == 0.1 and settings.max_concurrency == 3
    assert settings.rate_limit_rate == 0.25 and settings.key_matches("k")
    assert settings.tokens_per_s == SimSettings().tokens_per_s
    with pytest.raises(InvalidSettings, match="SIM_KEY"):
        settings_from_args(args, env={})
    too_much = parser.parse_args(["cloud-sim", "--error-5xx-rate", "0.7", "--timeout-rate", "0.7"])
    with pytest.raises(InvalidSettings, match="at most 1"):
        settings_from_args(too_much, env={})
