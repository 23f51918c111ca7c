"""Read a public LLM-serving arrival trace into `TraceRequest`s (arrival second, prompt and output tokens,
prefix block ids).

Formats (`--format`, else chosen from the file: a `.jsonl` file is Mooncake's, a CSV by its header row):

    mooncake   JSON lines: `timestamp` (ms from the start), `input_length`, `output_length` (tokens),
               `hash_ids` (ids of the prompt's 512-token blocks; equal ids = a shared prefix). Timestamps are
               quantised to ~3 s buckets: `bench replay` spreads a bucket over its 3 s (bench/replay/scaling.py).
    azure      the Azure LLM inference trace CSV: `TIMESTAMP` (a date-time such as 2023-11-16 18:15:46.6805900),
               `ContextTokens`, `GeneratedTokens`.
    burstgpt   BurstGPT's CSV: `Timestamp` (s), `Request tokens`, `Response tokens` (other columns ignored).
    csv        any CSV with a header row and a column mapping (`ColumnMap`): which column holds the time, the
               prompt tokens, the output tokens (and optionally space-separated block ids), and the time's unit.

Rows whose output is 0 tokens (BurstGPT's failed requests) are skipped and counted (`Trace.skipped`). Anything
else that is not a valid request is an error naming the line: a missing or non-numeric field, a negative or
absurd token count, a time that is not finite or goes back (a trace must be sorted by time), an undecodable
file. Bounded: at most `MAX_ROWS` requests and `MAX_LINE_BYTES` a line, so a hostile file costs bounded time
and memory. The trace's clock starts at 0 on its first request.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.load.target import BenchError

FORMATS = ("mooncake", "azure", "burstgpt", "csv")
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "iso": 0.0}
MAX_ROWS = 5_000_000
MAX_LINE_BYTES = 1 << 20
MAX_TOKENS = 10_000_000  # per request: far beyond any model's window, below anything absurd
MAX_BLOCKS = 100_000


class TraceError(BenchError):
    """A trace that cannot be replayed; the message names the file and line. Exit code 2 (bad input)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 2)


@dataclass(frozen=True)
class TraceRequest:
    arrival_s: float  # from the trace's first request
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()  # prompt blocks, in order (empty: the format has none)
    line: int = 0  # where it came from (1-based)


@dataclass(frozen=True)
class Trace:
    format: str
    requests: tuple[TraceRequest, ...]
    skipped: int = 0  # rows with 0 output tokens
    block_tokens: int | None = None  # tokens per hash_ids block (Mooncake: 512)

    @property
    def duration_s(self) -> float:
        return self.requests[-1].arrival_s if self.requests else 0.0


@dataclass(frozen=True)
class ColumnMap:
    """Which CSV column holds what (`--columns time=ts,input=prompt,output=completion[,blocks=ids]`)."""

    time: str
    input: str
    output: str
    blocks: str | None = None
    time_unit: str = "s"

    @classmethod
    def parse(cls, text: str, time_unit: str = "s") -> ColumnMap:
        fields: dict[str, str] = {}
        for part in text.split(","):
            key, sep, value = part.partition("=")
            key, value = key.strip(), value.strip()
            if not sep or key not in ("time", "input", "output", "blocks") or not value or key in fields:
                raise TraceError(
                    f"--columns {text!r}: expected time=COLUMN,input=COLUMN,output=COLUMN[,blocks=COLUMN], "
                    "each key once"
                )
            fields[key] = value
        missing = [k for k in ("time", "input", "output") if k not in fields]
        if missing:
            raise TraceError(f"--columns {text!r}: missing {', '.join(missing)}")
        if time_unit not in TIME_UNITS:
            raise TraceError(f"--time-unit must be one of {', '.join(TIME_UNITS)}, not {time_unit!r}")
        return cls(fields["time"], fields["input"], fields["output"], fields.get("blocks"), time_unit)


AZURE = ColumnMap("TIMESTAMP", "ContextTokens", "GeneratedTokens", time_unit="iso")
BURSTGPT = ColumnMap("Timestamp", "Request tokens", "Response tokens", time_unit="s")


def read_trace(path: str | Path, fmt: str | None = None, columns: ColumnMap | None = None) -> Trace:
    """The trace at `path` (see the module docstring); raises `TraceError` for anything unusable."""
    path = Path(path)
    if fmt is not None and fmt not in FORMATS:
        raise TraceError(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    if fmt == "csv" and columns is None:
        raise TraceError("--format csv needs --columns time=COLUMN,input=COLUMN,output=COLUMN")
    if not path.is_file():
        raise TraceError(f"{path}: no such file")
    with path.open("rb") as raw:
        text = io.TextIOWrapper(raw, encoding="utf-8", errors="strict", newline="")
        try:
            lines = _bounded_lines(text, path)
            first = next(lines, None)
            if first is None:
                raise TraceError(f"{path}: the file is empty")
            chosen = fmt or _detect(path, first, columns)
            rows = itertools.chain([first], lines)
            if chosen == "mooncake":
                return _collect("mooncake", _mooncake_rows(rows), block_tokens=512)
            mapping = {"azure": AZURE, "burstgpt": BURSTGPT}.get(chosen) or columns
            assert mapping is not None
            return _collect(chosen, _csv_rows(path, rows, mapping), block_tokens=None)
        except UnicodeDecodeError as exc:
            raise TraceError(f"{path}: not UTF-8 text ({exc.reason})") from None
        except TraceError as exc:
            if exc.message.startswith(f"{path}:"):
                raise
            raise TraceError(f"{path}: {exc.message}") from None


def _bounded_lines(text: io.TextIOWrapper, path: Path) -> Iterator[str]:
    while True:
        line = text.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        if len(line) > MAX_LINE_BYTES:
            raise TraceError(f"{path}: a line is longer than {MAX_LINE_BYTES} bytes: not a trace")
        yield line


def _detect(path: Path, first: str, columns: ColumnMap | None) -> str:
    if columns is not None:
        return "csv"
    if path.suffix.lower() in (".jsonl", ".json") or first.lstrip().startswith("{"):
        return "mooncake"
    header = {name.strip() for name in next(csv.reader([first]), [])}
    if {AZURE.time, AZURE.input, AZURE.output} <= header:
        return "azure"
    if {BURSTGPT.time, BURSTGPT.input, BURSTGPT.output} <= header:
        return "burstgpt"
    raise TraceError(
        f"{path}: cannot tell the format from the first line; pass --format "
        f"({', '.join(FORMATS)}; csv with --columns time=...,input=...,output=...)"
    )


Row = tuple[int, float, Any, Any, Any]  # line, seconds, input, output, blocks


def _mooncake_rows(lines: Iterator[str]) -> Iterator[Row]:
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError:
            raise TraceError(f"line {number}: not a JSON object") from None
        if not isinstance(item, dict):
            raise TraceError(f"line {number}: not a JSON object")
        missing = [k for k in ("timestamp", "input_length", "output_length") if k not in item]
        if missing:
            raise TraceError(f"line {number}: missing {', '.join(missing)}")
        stamp = _number(item["timestamp"], number, "timestamp")
        yield number, stamp / 1000.0, item["input_length"], item["output_length"], item.get("hash_ids", [])


def _csv_rows(path: Path, lines: Iterator[str], columns: ColumnMap) -> Iterator[Row]:
    reader = csv.reader(lines)
    header = [name.strip() for name in next(reader, [])]
    wanted = [c for c in (columns.time, columns.input, columns.output, columns.blocks) if c is not None]
    missing = [c for c in wanted if c not in header]
    if missing:
        raise TraceError(f"{path}: no column {', '.join(map(repr, missing))} in the header ({', '.join(header)})")
    at = {name: header.index(name) for name in wanted}
    parse_time = _time_parser(columns.time_unit)
    for row in reader:
        number = reader.line_num
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) < len(header):
            raise TraceError(f"line {number}: {len(row)} fields, the header has {len(header)}")
        stamp = parse_time(row[at[columns.time]].strip(), number)
        blocks: Any = []
        if columns.blocks is not None:
            blocks = _block_ids(row[at[columns.blocks]], number)
        yield number, stamp, row[at[columns.input]].strip(), row[at[columns.output]].strip(), blocks


def _time_parser(unit: str) -> Callable[[str, int], float]:
    if unit == "iso":

        def iso(text: str, line: int) -> float:
            return _iso_seconds(text, line)

        return iso
    scale = TIME_UNITS[unit]

    def numeric(text: str, line: int) -> float:
        return _number(text, line, "time") * scale

    return numeric


def _iso_seconds(text: str, line: int) -> float:
    """Seconds since the epoch of a date-time; more than 6 fractional digits (Azure writes 7) are cut to 6."""
    head, dot, fraction = text.partition(".")
    if dot:
        digits = "".join(ch for ch in fraction if ch.isdigit())
        rest = fraction[len(digits) :]
        text = f"{head}.{(digits[:6] or '0').ljust(6, '0')}{rest}"
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise TraceError(f"line {line}: time {text[:40]!r} is not a date-time (e.g. 2023-11-16 18:15:46.68)") from None
    if moment.tzinfo is None:
        return (moment - datetime(1970, 1, 1)).total_seconds()
    return moment.timestamp()


def _block_ids(text: str, line: int) -> list[int]:
    parts = text.split()
    if len(parts) > MAX_BLOCKS:
        raise TraceError(f"line {line}: more than {MAX_BLOCKS} block ids")
    try:
        return [int(p) for p in parts]
    except ValueError:
        raise TraceError(f"line {line}: block ids must be whole numbers separated by spaces") from None


def _number(value: Any, line: int, name: str) -> float:
    if isinstance(value, bool):
        raise TraceError(f"line {line}: {name} must be a number, not {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TraceError(f"line {line}: {name} must be a number, not {str(value)[:40]!r}") from None
    if not math.isfinite(number):
        raise TraceError(f"line {line}: {name} must be finite, not {value!r}")
    return number


def _tokens(value: Any, line: int, name: str) -> int:
    number = _number(value, line, name)
    if number != int(number) or number < 0 or number > MAX_TOKENS:
        raise TraceError(f"line {line}: {name} must be a whole number of tokens in [0, {MAX_TOKENS}], not {value!r}")
    return int(number)


def _hash_ids(value: Any, line: int) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > MAX_BLOCKS:
        raise TraceError(f"line {line}: hash_ids must be a list of at most {MAX_BLOCKS} whole numbers")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise TraceError(f"line {line}: hash_ids must be whole numbers")
    return tuple(value)


def _collect(fmt: str, rows: Iterator[Row], *, block_tokens: int | None) -> Trace:
    requests: list[TraceRequest] = []
    skipped = 0
    origin: float | None = None
    previous = -math.inf
    for line, stamp, raw_in, raw_out, raw_blocks in rows:
        if stamp < previous:
            raise TraceError(
                f"line {line}: time {stamp:.6g} s is before the previous request's {previous:.6g} s "
                "(a trace must be sorted by time)"
            )
        previous = stamp
        prompt = _tokens(raw_in, line, "input tokens")
        output = _tokens(raw_out, line, "output tokens")
        blocks = _hash_ids(raw_blocks, line)
        if output == 0:
            skipped += 1
            continue
        if len(requests) >= MAX_ROWS:
            raise TraceError(f"more than {MAX_ROWS} requests; cut the trace to the window you replay")
        origin = stamp if origin is None else origin
        requests.append(TraceRequest(stamp - origin, max(1, prompt), output, blocks, line))
    if not requests:
        raise TraceError(f"no request to replay ({skipped} rows with 0 output tokens)")
    return Trace(fmt, tuple(requests), skipped, block_tokens)
