"""Reading a decision log (`gateway.decisions_log`, JSONL) and the config a replay runs under.

`read_decision_log(path)` is bounded: a regular file over `max_bytes` is refused whole (ConfigError
naming the size and the limit, before a byte is parsed); a pipe (a FIFO, `<(zcat log.gz)`) has no size,
so reading it stops with the same error at the byte past `max_bytes` (opening one waits for no writer);
a device (`/dev/zero`), a socket or a directory is refused. A line over `max_line_bytes` is skipped
without being held in memory; a line that is not UTF-8 JSON (nested past Python's limit included), not
an object, or a blob line without a kind, an id and a body is skipped. Each skipped line is counted,
and the first `MAX_EXAMPLES` are named with their line number and why.

Memory follows the log's bytes, not what its JSON would parse into (a schema blob of `[{}, {}, ...]`
parses into ~20 times its size): record lines are kept as read and parsed one at a time when the
replay reads them (`Records`, router/learning/replay.py checks the fields it needs); blob lines
(router/learning/decision_inputs.py) are indexed by id and parsed on lookup, the parsed ones cached up to
`BLOB_CACHE_BYTES` of their lines (`Blobs`). At most about twice the log's bytes are held, plus one
parsed line.

`load_replay_config(policy_path, config_path)`: a full deployment config (a YAML with `models`), or a
file holding only a policy, which replaces the policy of the config at `config_path`.
"""

from __future__ import annotations

import json
import os
import stat
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, overload

import yaml

from cluster.config.deployment import SpilloverConfig, dump_config, load_config, parse_config
from router.errors import ConfigError
from router.learning.decision_inputs import BLOB_KINDS

DEFAULT_MAX_BYTES = 256 * 1024 * 1024
DEFAULT_MAX_LINE_BYTES = 4 * 1024 * 1024
MAX_EXAMPLES = 20
_CHUNK = 1024 * 1024
BLOB_CACHE_BYTES = 8 * 1024 * 1024  # of parsed blob lines kept at once


class Records(Sequence[dict[str, Any]]):
    """The record lines as read (bytes), parsed one at a time when used: a replay holds one parsed
    record at a time, so memory follows the log's bytes, not what its JSON parses into."""

    def __init__(self) -> None:
        self._lines: list[bytes] = []

    def append(self, line: bytes) -> None:
        self._lines.append(line)

    def __len__(self) -> int:
        return len(self._lines)

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(index, slice):
            return [_loads(line) for line in self._lines[index]]
        return _loads(self._lines[index])

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (_loads(line) for line in self._lines)


class Blobs(Mapping[str, dict[str, Any]]):
    """Blob lines by id, kept as read and parsed on lookup into `{"kind", "body"}`; the parsed ones are
    cached up to `cache_bytes` of their lines (a snapshot blob is quoted by many records)."""

    def __init__(self, cache_bytes: int = BLOB_CACHE_BYTES) -> None:
        self._lines: dict[str, bytes] = {}
        self._cache: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._cached_bytes = 0
        self._cache_bytes = cache_bytes

    def add(self, blob_id: str, line: bytes) -> None:
        self._lines[blob_id] = line
        if self._cache.pop(blob_id, None) is not None:
            self._cached_bytes = sum(len(self._lines[k]) for k in self._cache)

    def __getitem__(self, blob_id: str) -> dict[str, Any]:
        cached = self._cache.get(blob_id)
        if cached is not None:
            self._cache.move_to_end(blob_id)
            return cached
        line = self._lines[blob_id]
        item = _loads(line)
        blob = {"kind": item["kind"], "body": item["body"]}
        self._cache[blob_id] = blob
        self._cached_bytes += len(line)
        while self._cached_bytes > self._cache_bytes and len(self._cache) > 1:
            old, _ = self._cache.popitem(last=False)
            self._cached_bytes -= len(self._lines[old])
        return blob

    def __len__(self) -> int:
        return len(self._lines)

    def __iter__(self) -> Iterator[str]:
        return iter(self._lines)


@dataclass
class DecisionLog:
    records: Records = field(default_factory=Records)
    blobs: Blobs = field(default_factory=Blobs)
    malformed: int = 0
    examples: list[str] = field(default_factory=list)  # "line N: why", the first MAX_EXAMPLES

    def skip(self, number: int, why: str) -> None:
        self.malformed += 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(f"line {number}: {why}")


def _loads(line: bytes) -> Any:
    return json.loads(line.decode("utf-8"))


class _Bounded:
    """A binary handle that refuses to read more than `max_bytes` in all (a pipe or a device has no size
    to check first): past it, the ConfigError of a log over --max-bytes."""

    def __init__(self, handle: BinaryIO, max_bytes: int, path: Path) -> None:
        self._handle, self._max, self._path = handle, max_bytes, path
        self.read = 0

    def readline(self, limit: int) -> bytes:
        line = self._handle.readline(min(limit, self._max - self.read + 1))
        self.read += len(line)
        if self.read > self._max:
            raise ConfigError(str(self._path), [("(file)", f"more than the limit of {self._max} bytes (--max-bytes)")])
        return line


def _lines(handle: _Bounded, max_line_bytes: int) -> Iterator[tuple[int, bytes | None]]:
    """(number, bytes or None when too long) for each line, never holding more than max_line_bytes + 1."""
    number = 0
    while True:
        line = handle.readline(max_line_bytes + 1)
        if not line:
            return
        number += 1
        if len(line) > max_line_bytes and not line.endswith(b"\n"):
            while True:  # drop the rest of the over-long line
                rest = handle.readline(_CHUNK)
                if not rest or rest.endswith(b"\n"):
                    break
            yield number, None
            continue
        yield number, line


def _parse(log: DecisionLog, number: int, line: bytes) -> None:
    try:
        item = _loads(line)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        log.skip(number, f"not JSON ({type(exc).__name__})")
        return
    if not isinstance(item, dict):
        log.skip(number, "not a JSON object")
        return
    kind = item.get("kind")
    if kind is None:
        if not isinstance(item.get("request_id"), str) or not isinstance(item.get("contract"), dict):
            log.skip(number, "a record needs a request_id and a contract")
            return
        log.records.append(line)
    elif kind in BLOB_KINDS and isinstance(item.get("id"), str) and "body" in item:
        log.blobs.add(item["id"], line)
    else:
        log.skip(number, f"unknown line kind {str(kind)[:40]!r} or a blob without id and body")


def _open(path: Path, max_bytes: int) -> BinaryIO:
    """A regular file over `max_bytes` is refused before a byte is read; a pipe (a FIFO, `<(zcat ...)`)
    is opened without waiting for a writer (none: an empty log) and read bounded; a device or a socket
    is refused: no decision log is one."""
    mode = os.stat(path).st_mode
    if stat.S_ISREG(mode):
        size = os.stat(path).st_size
        if size > max_bytes:
            raise ConfigError(
                str(path), [("(file)", f"{size} bytes is more than the limit of {max_bytes} (--max-bytes)")]
            )
        return open(path, "rb")
    if stat.S_ISFIFO(mode):
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO nobody writes to would block open() forever
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    if stat.S_ISDIR(mode):
        raise ConfigError(str(path), [("(file)", "a directory, not a decision log")])
    raise ConfigError(str(path), [("(file)", "not a regular file or a pipe (a device or a socket is no decision log)")])


def read_decision_log(
    path: str | Path, *, max_bytes: int = DEFAULT_MAX_BYTES, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
) -> DecisionLog:
    path = Path(path)
    try:
        log = DecisionLog()
        with _open(path, max_bytes) as raw:
            for number, line in _lines(_Bounded(raw, max_bytes, path), max_line_bytes):
                if line is None:
                    log.skip(number, f"longer than {max_line_bytes} bytes")
                elif line.strip():
                    _parse(log, number, line)
    except OSError as exc:
        raise ConfigError(str(path), [("(file)", exc.strerror or str(exc))]) from None
    return log


def load_replay_config(policy_path: str | Path, config_path: str | Path) -> SpilloverConfig:
    """The config the replay runs under (see the module docstring)."""
    policy_path = Path(policy_path)
    try:
        data = yaml.safe_load(policy_path.read_text())
    except OSError as exc:
        raise ConfigError(str(policy_path), [("(file)", exc.strerror or str(exc))]) from None
    except yaml.YAMLError as exc:
        raise ConfigError(str(policy_path), [("(file)", f"not valid YAML: {getattr(exc, 'problem', exc)}")]) from None
    if isinstance(data, dict) and "models" in data:
        return load_config(policy_path)
    if isinstance(data, dict) and set(data) == {"policy"}:
        data = data["policy"]
    raw = dump_config(load_config(config_path))
    raw["policy"] = data
    return parse_config(raw, f"{config_path} with the policy of {policy_path}")
