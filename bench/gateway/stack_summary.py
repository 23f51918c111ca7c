"""Summarise py-spy's raw (collapsed) stacks of the gateway replica: where its CPU time goes.

    python -m bench.gateway.stack_summary OUT/gateway-profile.txt > OUT/gateway-profile.md

Each input line is `frame;frame;...;leaf COUNT`, a frame being `function (path:line)`. The summary gives
the share of samples per layer of the leaf frame (spillover's own packages, Starlette/uvicorn, httpx,
Ray, asyncio, JSON/pydantic, other), the top functions by self samples and by inclusive samples
(a function counted once per stack), line numbers dropped.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<path>[^()]*?)(?::\d+)?\)$")
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("spillover", ("router/", "cluster/", "serve_apps/", "bench/")),
    ("starlette / uvicorn / fastapi", ("starlette/", "uvicorn/", "fastapi/", "h11/", "httptools/")),
    ("httpx / httpcore", ("httpx/", "httpcore/", "anyio/")),
    ("ray", ("ray/",)),
    ("asyncio / uvloop", ("asyncio/", "uvloop/", "selectors.py", "threading.py", "concurrent/")),
    ("json / pydantic", ("json/", "pydantic", "orjson", "jsonschema")),
)


@dataclass(frozen=True)
class Summary:
    total: int
    layers: list[tuple[str, int]]
    self_top: list[tuple[str, int]]
    inclusive_top: list[tuple[str, int]]


def _frame(text: str) -> tuple[str, str]:
    match = _FRAME.match(text.strip())
    if match is None:
        return text.strip(), ""
    return match["func"], match["path"]


def layer_of(path: str) -> str:
    for name, markers in LAYERS:
        if any(marker in path for marker in markers):
            return name
    return "other"


def _short(func: str, path: str) -> str:
    tail = "/".join(path.split("/")[-2:]) if path else "?"
    return f"{func} ({tail})"


def summarise(lines: Iterable[str], top: int = 25) -> Summary:
    layers: Counter[str] = Counter()
    self_counts: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in lines:
        stack, _, count_text = line.rstrip("\n").rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [fr for fr in (_frame(f) for f in stack.split(";")) if ".py" in fr[1]]  # not process or thread
        if not frames:
            continue
        total += count
        leaf_func, leaf_path = frames[-1]
        layers[layer_of(leaf_path)] += count
        self_counts[_short(leaf_func, leaf_path)] += count
        for name in {_short(func, path) for func, path in frames}:
            inclusive[name] += count
    return Summary(total, layers.most_common(), self_counts.most_common(top), inclusive.most_common(top))


def render(summary: Summary) -> str:
    def pct(n: int) -> str:
        return f"{100 * n / summary.total:.1f}%" if summary.total else "–"

    out = [
        f"# Gateway replica CPU profile ({summary.total} samples)",
        "",
        "| layer of the leaf frame | share |",
        "|---|---|",
    ]
    out += [f"| {name} | {pct(n)} |" for name, n in summary.layers]
    out += ["", "| top functions, self | share |", "|---|---|"]
    out += [f"| `{name}` | {pct(n)} |" for name, n in summary.self_top]
    out += ["", "| top functions, inclusive | share |", "|---|---|"]
    out += [f"| `{name}` | {pct(n)} |" for name, n in summary.inclusive_top]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway.stack_summary", description=__doc__.splitlines()[0])
    parser.add_argument("file", help="py-spy record --format raw output")
    parser.add_argument("--top", type=int, default=25, help="functions per table (25)")
    args = parser.parse_args(argv)
    try:
        with open(args.file, encoding="utf-8", errors="replace") as f:
            summary = summarise(f, args.top)
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(render(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
