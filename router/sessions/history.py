"""Server-side history of a session (`sessions.store: true`): pure merging and bounding.

With the store on, a client that names its session sends only its new turn(s); the gateway puts the
stored history in front of them (after the client's own system messages) — the newest stored messages
that fit `history_tokens`, never splitting a tool result from the assistant turn that called it. What
did not fit is counted (`dropped`) and shown in the decision record, never dropped silently.

A client that sends the whole conversation anyway (most OpenAI clients do) is not given it twice: when
the stored messages appear, in order, among what it sent, nothing is supplied and only what follows
them is new (`resent`).

After an answered turn the session's stored history grows by the client's new non-system messages and
the answer (`grown`), and is cut to its newest `max_bytes` of JSON (a stored session is bounded; the
table of sessions is bounded by `sessions.max_sessions`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from router.sessions.compress import message_tokens


def _role(message: Any) -> str:
    return str(message.get("role", "")) if isinstance(message, Mapping) else ""


@dataclass(frozen=True)
class Supplied:
    messages: list[Any]  # what the request runs with
    supplied: int  # stored messages put in front of the client's
    dropped: int  # stored messages that did not fit history_tokens
    tokens: int  # estimated tokens of the supplied messages
    new: list[Any]  # the client's messages the store does not hold yet
    resent: int = 0  # stored messages the client sent itself (then nothing is supplied)


def _key(message: Any) -> str:
    """What makes a sent message the stored one: its role, its content and the tool call it answers."""
    if not isinstance(message, Mapping):
        return "?"
    content = message.get("content") or ""
    return json.dumps([_role(message), content, message.get("tool_call_id")], sort_keys=True, default=str)


def resent_at(stored: Sequence[Any], sent: Sequence[Any]) -> int | None:
    """The index in `sent` just after the last place `stored` appears in it as one run; None when it does not."""
    if not stored or len(stored) > len(sent) or len(stored) > 100_000:  # beyond: one character per message runs out
        return None
    codes: dict[str, str] = {}
    # each distinct message is one character: a run of messages is a substring (found in linear time)
    stored_text = "".join(codes.setdefault(_key(m), chr(0x100 + len(codes))) for m in stored)
    sent_text = "".join(codes.get(_key(m), "\x00") for m in sent)
    found = sent_text.rfind(stored_text)
    return None if found < 0 else found + len(stored)


def supply(stored: Sequence[Any], sent: Sequence[Any], history_tokens: int) -> Supplied:
    """The request's messages: the client's leading system messages, then the newest stored messages
    within `history_tokens`, then the rest of what the client sent."""
    head = 0
    while head < len(sent) and _role(sent[head]) in ("system", "developer"):
        head += 1
    after = resent_at(stored, sent[head:])
    if after is not None:
        return Supplied(list(sent), 0, 0, 0, list(sent[head + after :]), resent=len(stored))
    kept: list[Any] = []
    tokens = 0
    for message in reversed(stored):
        size = message_tokens(message)
        if tokens + size > history_tokens:
            break
        kept.insert(0, message)
        tokens += size
    while kept and _role(kept[0]) == "tool":  # a tool result without its call would be refused
        tokens -= message_tokens(kept.pop(0))
    merged = [*sent[:head], *kept, *sent[head:]]
    return Supplied(merged, len(kept), len(stored) - len(kept), tokens, list(sent[head:]))


def grown(stored: Sequence[Any], sent: Sequence[Any], answer: Mapping[str, Any] | None, max_bytes: int) -> list[Any]:
    """The stored history after a turn: plus the client's new non-system messages and the answer,
    cut to its newest `max_bytes` of JSON."""
    new = [m for m in sent if isinstance(m, Mapping) and _role(m) not in ("system", "developer")]
    history = [*stored, *new, *([dict(answer)] if answer is not None else [])]
    sizes = [len(json.dumps(m, separators=(",", ":"), ensure_ascii=False).encode()) for m in history]
    total, start = sum(sizes) + len(sizes) + 1, 0  # the list's brackets and commas
    while total > max_bytes and start < len(history):
        total -= sizes[start] + 1
        start += 1
    while start < len(history) and _role(history[start]) == "tool":
        start += 1
    return list(history[start:])
