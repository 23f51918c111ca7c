"""What a health machine has seen: the latest live outcome, the latest probe of each level, and
where the two disagree.

Why live outranks probes: a probe is one synthetic request on a schedule; live traffic is what
clients actually experience, many times a second. When they disagree — `GET /models` fails while
chats succeed, or a tiny probe prompt passes while real requests fail — routing must follow what
requests experience, and it must not depend on when the probe schedule happened to fire (a
gateway that started 10 s ago and one that started an hour ago must route the same fault the same
way). So while a live outcome is at most `live_evidence_s` old, liveness and latency probes are
recorded here and shown, but do not move the state; a probe that contradicts the latest live
outcome is counted as overruled. Correctness probes always count: a live request that was
answered says nothing about whether the answer was right.

A probe answer that is a client-side rejection (the provider refused the probe's request itself:
a 4xx other than 401/403/408/429) is no evidence either way: it is counted and its reason kept
for the operator.

Pure: times are the caller's clock readings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ProbeLevel = Literal["liveness", "latency", "correctness"]
OUTRANKED_LEVELS: tuple[ProbeLevel, ...] = ("liveness", "latency")  # what live traffic also measures
MAX_DETAIL = 200


@dataclass(frozen=True)
class Seen:
    at: float
    ok: bool
    counted: bool = True  # probes only: False when live evidence outranked it


class Evidence:
    def __init__(self, live_evidence_s: float) -> None:
        self._live_evidence_s = live_evidence_s
        self.live: Seen | None = None
        self.probes: dict[str, Seen] = {}
        self._overruled: dict[str, str] = {}  # level -> why, while its latest probe contradicts live traffic
        self.overruled_total = 0
        self.rejections_total = 0
        self.last_rejection: str | None = None

    def live_verdict(self, now: float) -> bool | None:
        """The latest live outcome if it is recent enough to outrank probes, else None."""
        if self.live is None or now - self.live.at >= self._live_evidence_s:
            return None
        return self.live.ok

    def saw_live(self, now: float, ok: bool) -> None:
        self.live = Seen(now, ok)

    def saw_probe(self, now: float, level: ProbeLevel, ok: bool) -> bool:
        """Record a probe result; True when it counts (may move the state), False when live
        traffic outranks it."""
        verdict = self.live_verdict(now) if level in OUTRANKED_LEVELS else None
        counted = verdict is None
        self.probes[level] = Seen(now, ok, counted)
        if counted or verdict == ok:
            self._overruled.pop(level, None)
        else:
            self.overruled_total += 1
            live = "succeed" if verdict else "fail"
            self._overruled[level] = f"{level} probe {'passed' if ok else 'failed'} while live requests {live}"
        return counted

    def saw_rejection(self, level: ProbeLevel, detail: str) -> None:
        self.rejections_total += 1
        self.last_rejection = f"{level} probe rejected by the target: {detail}"[:MAX_DETAIL]

    @property
    def disagreement(self) -> str | None:
        """Why probes and live traffic disagree right now (live decides), or None."""
        return "; ".join(self._overruled[k] for k in sorted(self._overruled)) or None
