"""Summaries of a session's older turns, kept so that a later turn does not summarise them again.

Pure: no clock, no I/O. A session that runs on a target whose window is smaller than its history has
its older turns summarised on every turn (router/sessions/compress.py), and the next turn's older turns are the
same ones plus the turn that just ended. `SummaryCache` keeps, per session (its pin key), the last
summary a model wrote and which messages it covers (how many, and one digest of them all): a later
turn whose summarised run starts with exactly those messages reuses it — for the whole run, without
asking the summariser at all; for a longer run, the summariser gets that summary and only the newer
turns (`incremental_transcript`), not the whole transcript again. An extractive summary (the
summariser did not answer) is never kept. A kept summary holds its turns' text, so it keeps their
label (router/sessions/carried.py): the caller reuses it only for a target that label admits, and writes a
new one otherwise. At most `max_sessions` summaries are kept, evicted per tenant (the least recently
used of the tenant holding the most: router/sessions/tenant_lru.py), each a summary of at most
`sessions.compress.summary_tokens` (a few hundred bytes by default) and a digest; each gateway
replica keeps its own.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from router.sessions.carried import Label
from router.sessions.compress import CompressionPlan, transcript
from router.sessions.session_id import tenant_of_key
from router.sessions.tenant_lru import TenantLru

EARLIER = "Summary of the turns before these: "


@dataclass(frozen=True)
class KeptSummary:
    text: str
    by: str  # model:<alias>
    count: int  # the summarised messages it covers: the first `count` of the run
    digest: str  # of those messages
    label: Label  # the constraints of the turns it summarises (router/sessions/carried.py)


def run_digest(messages: Sequence[Any]) -> str:
    """One digest of `messages` in order (their JSON, keys sorted)."""
    digest = hashlib.sha256()
    for message in messages:
        digest.update(json.dumps(message, sort_keys=True, separators=(",", ":"), default=str).encode())
        digest.update(b"\0")
    return digest.hexdigest()


class SummaryCache:
    def __init__(self, max_sessions: int = 10_000) -> None:
        self._kept: TenantLru[KeptSummary] = TenantLru(max_sessions, tenant_of_key)

    def __len__(self) -> int:
        return len(self._kept)

    def held(self, tenant: str) -> int:
        return self._kept.held(tenant)

    def find(self, key: str, run: Sequence[Any]) -> KeptSummary | None:
        """The kept summary of session `key` when it covers the first messages of `run` (or all of it)."""
        kept = self._kept.peek(key)
        if kept is None or kept.count > len(run) or run_digest(run[: kept.count]) != kept.digest:
            return None
        self._kept.get(key)  # now the most recently used
        return kept

    def keep(self, key: str, text: str, by: str, run: Sequence[Any], label: Label) -> None:
        self._kept.put(key, KeptSummary(text, by, len(run), run_digest(run), label))


def incremental_transcript(kept: KeptSummary, messages: Sequence[Any], plan: CompressionPlan, max_chars: int) -> str:
    """What the summariser gets when `kept` covers the start of the planned run: that summary, then the
    newer turns only (the newest kept within `max_chars`)."""
    earlier = EARLIER + kept.text + "\n"
    newer = transcript(messages, replace(plan, start=plan.start + kept.count), max(0, max_chars - len(earlier)))
    return (earlier + newer)[-max_chars:]
