"""The events one gateway replica's learning evidence travels in to the others, and how a read one is checked.

Three kinds, each compact JSON under the replica's id `r`:

    q   a finished request's attempts in its quality bucket:   {"b": bucket, "a": [[target, outcome, s], ...]}
    f   a feedback verdict the quality book took:              {"b", "t": target, "ok", "o": owner, "sh": shared}
    o   a request's end, for live scores and switch gates:     {"m": model, "s": scenario, "n": tokens,
                                                                 "w": epoch s, "a": [...]}

What is read back comes from the store, so it is checked as hostile input: a bounded size, known targets,
models, scenarios and owners (the config's), known outcomes, finite latencies, a bucket key of the quality
book's own shape. Anything else is not applied (`parse` answers None), so a planted value cannot make a
replica learn of a target it does not route to, grow a book past its bounds, or raise.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from router.learning.decision import Attempt

MAX_EVENT_BYTES = 16 * 1024
MAX_ATTEMPTS = 16
MAX_LATENCY_S = 86_400.0
OUTCOMES = frozenset({"ok", "error", "contract_violation", "timeout", "cancelled", "skipped", "streaming", "cut"})
BUCKET = re.compile(r"task=[\w.:-]{1,64}\|lang=[\w-]{1,16}\|len=(short|medium|long|xlong)\|tools=[01]\|risk=L[123]")


@dataclass(frozen=True)
class Vocabulary:
    """What an event may name: the gateway's own targets, scenarios and tenants (a model is any short name: it
    only finds a switch's scope, and what it keys, the target and the scenario, are checked)."""

    targets: frozenset[str]
    scenarios: frozenset[str]
    owners: frozenset[str]  # tenant names, and "" (no auth)


@dataclass(frozen=True)
class QualityEvent:
    replica: str
    bucket: str
    attempts: tuple[tuple[str, str, float], ...]


@dataclass(frozen=True)
class FeedbackEvent:
    replica: str
    bucket: str
    target: str
    success: bool
    owner: str
    shared: bool


@dataclass(frozen=True)
class OutcomeEvent:
    replica: str
    model: str
    scenario: str
    tokens: int
    wall: float
    attempts: tuple[Attempt, ...]


Event = QualityEvent | FeedbackEvent | OutcomeEvent


def _attempts(attempts: Iterable[tuple[str, str, float]]) -> list[list[Any]]:
    return [[t, o, round(s, 4)] for t, o, s in list(attempts)[:MAX_ATTEMPTS]]


def quality_event(replica: str, bucket: str, attempts: Iterable[tuple[str, str, float]]) -> bytes:
    return _dump({"r": replica, "k": "q", "b": bucket, "a": _attempts(attempts)})


def feedback_event(replica: str, bucket: str, target: str, success: bool, owner: str, shared: bool) -> bytes:
    return _dump({"r": replica, "k": "f", "b": bucket, "t": target, "ok": success, "o": owner, "sh": shared})


def outcome_event(
    replica: str, model: str, scenario: str, tokens: int, wall: float, attempts: Sequence[Attempt]
) -> bytes:
    tried = _attempts((a.target, a.outcome, a.latency_s) for a in attempts)
    return _dump({"r": replica, "k": "o", "m": model, "s": scenario, "n": tokens, "w": round(wall, 3), "a": tried})


def _dump(event: dict[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode()


def parse(raw: bytes, vocab: Vocabulary) -> Event | None:
    """The event in `raw`, or None when it is not one this gateway would have written."""
    if len(raw) > MAX_EVENT_BYTES:
        return None
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(data, dict) or not _text(data.get("r"), 128):
        return None
    try:
        return _event(data, vocab)
    except (TypeError, ValueError, KeyError, OverflowError):
        return None


def _event(data: dict[str, Any], vocab: Vocabulary) -> Event | None:
    replica, kind = data["r"], data.get("k")
    if kind == "f":
        bucket, target, owner = data["b"], data["t"], data["o"]
        ok, shared = data["ok"], data["sh"]
        if not (_bucket(bucket) and target in vocab.targets and owner in vocab.owners):
            return None
        if not (isinstance(ok, bool) and isinstance(shared, bool)):
            return None
        return FeedbackEvent(replica, bucket, target, ok, owner, shared)
    attempts = _read_attempts(data["a"], vocab)
    if attempts is None:
        return None
    if kind == "q":
        return QualityEvent(replica, data["b"], attempts) if _bucket(data["b"]) else None
    if kind == "o":
        model, scenario, tokens, wall = data["m"], data["s"], data["n"], data["w"]
        if not _text(model, 256) or scenario not in vocab.scenarios:
            return None
        if not (_int(tokens) and 0 <= tokens <= 100_000_000 and _number(wall) and math.isfinite(wall)):
            return None
        return OutcomeEvent(replica, model, scenario, tokens, float(wall), tuple(Attempt(*a) for a in attempts))
    return None


def _read_attempts(raw: Any, vocab: Vocabulary) -> tuple[tuple[str, str, float], ...] | None:
    if not isinstance(raw, list) or len(raw) > MAX_ATTEMPTS:
        return None
    out: list[tuple[str, str, float]] = []
    for item in raw:
        if not (isinstance(item, list) and len(item) == 3):
            return None
        target, outcome, seconds = item
        if target not in vocab.targets or outcome not in OUTCOMES or not _number(seconds):
            return None
        if not (math.isfinite(seconds) and 0 <= seconds <= MAX_LATENCY_S):
            return None
        out.append((target, outcome, float(seconds)))
    return tuple(out)


def _text(value: Any, limit: int) -> bool:
    return isinstance(value, str) and 0 < len(value) <= limit


def _bucket(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= 200 and BUCKET.fullmatch(value) is not None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
