"""Reading a decision log (`gateway.decisions_log`, JSONL) and the config a replay runs under.

`read_decision_log(path)` is bounded: a file over `max_bytes` is refused whole (ConfigError naming
the size and the limit, before a byte is parsed); a line over `max_line_bytes` is skipped without
being held in memory; a line that is not UTF-8 JSON, not an object, or a blob line without a kind,
an id and a body is skipped. Each skipped line is counted, and the first `MAX_EXAMPLES` are named
with their line number and why. Record lines are returned as parsed (router/replay.py checks the
fields it needs); blob lines (router/decision_inputs.py) are indexed by id.

`load_replay_config(policy_path, config_path)`: a full deployment config (a YAML with `models`), or a
file holding only a policy, which replaces the policy of the config at `config_path`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cluster.config import SpilloverConfig, dump_config, load_config, parse_config
from router.decision_inputs import BLOB_KINDS
from router.errors import ConfigError

DEFAULT_MAX_BYTES = 256 * 1024 * 1024
DEFAULT_MAX_LINE_BYTES = 4 * 1024 * 1024
MAX_EXAMPLES = 20
_CHUNK = 1024 * 1024


@dataclass
class DecisionLog:
    records: list[dict[str, Any]] = field(default_factory=list)
    blobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    malformed: int = 0
    examples: list[str] = field(default_factory=list)  # "line N: why", the first MAX_EXAMPLES

    def skip(self, number: int, why: str) -> None:
        self.malformed += 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(f"line {number}: {why}")


def _lines(handle: Any, max_line_bytes: int) -> Any:
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
        item = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
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
        log.records.append(item)
    elif kind in BLOB_KINDS and isinstance(item.get("id"), str) and "body" in item:
        log.blobs[item["id"]] = {"kind": kind, "body": item["body"]}
    else:
        log.skip(number, f"unknown line kind {str(kind)[:40]!r} or a blob without id and body")


def read_decision_log(
    path: str | Path, *, max_bytes: int = DEFAULT_MAX_BYTES, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
) -> DecisionLog:
    path = Path(path)
    try:
        size = os.stat(path).st_size
        if size > max_bytes:
            raise ConfigError(
                str(path), [("(file)", f"{size} bytes is more than the limit of {max_bytes} (--max-bytes)")]
            )
        log = DecisionLog()
        with open(path, "rb") as handle:
            for number, line in _lines(handle, max_line_bytes):
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
