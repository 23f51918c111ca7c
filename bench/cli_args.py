"""Helpers shared by the bench subcommands' parsers and handlers."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from bench.load.target import BenchError


def number(kind: type, minimum: float, *, exclusive: bool = False, maximum: float | None = None) -> Callable:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a {'whole ' if kind is int else ''}number: {text!r}") from None
        if value < minimum or (exclusive and value == minimum) or (maximum is not None and value > maximum):
            upper = f" and <= {maximum:g}" if maximum is not None else ""
            raise argparse.ArgumentTypeError(f"must be {'>' if exclusive else '>='} {minimum:g}{upper}, got {text}")
        return value

    return parse


def levels(text: str) -> tuple[int, ...]:
    """A comma list of concurrency levels, each >= 1 (`--concurrency 1,8`)."""
    try:
        parsed = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        parsed = ()
    if not parsed or any(level < 1 for level in parsed):
        raise argparse.ArgumentTypeError(f"comma list of concurrencies >= 1: {text!r}")
    return parsed


def choices(names: tuple[str, ...], what: str) -> Callable[[str], tuple[str, ...]]:
    """A comma list of some of `names`, without repeats (`--faults error_5xx,reset`)."""

    def parse(text: str) -> tuple[str, ...]:
        picked = tuple(part.strip() for part in text.split(",") if part.strip())
        if not picked or any(p not in names for p in picked) or len(set(picked)) != len(picked):
            raise argparse.ArgumentTypeError(f"{what} are some of {','.join(names)} without repeats: {text!r}")
        return picked

    return parse


def run(command: Callable[[], Any], summary: Callable[[Any], list[str]]) -> int:
    """Run a bench command: its summary on stdout, or its error as one line on stderr."""
    try:
        outcome = command()
    except BenchError as exc:
        print(f"error: {exc.message}", file=sys.stderr, flush=True)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        return 130
    print("\n".join(summary(outcome)), flush=True)
    return int(outcome.exit_code)
