"""Circuit breakers per target and per failure domain.

Why two keys: several targets often share one provider endpoint or credential pool (a
*failure domain*). A 429 from that endpoint is a fact about the whole group, so swapping to another
model name in the same group does not leave the rate limit; `cool_domain` refuses every target of the
domain until Retry-After has passed. A single 503 from one target is *not* such a fact: it only feeds
that target's breaker, and the domain breaker trips on ordinary failures only when they come from at
least two distinct targets. Local targets get their own domain ("local:<alias>").

One `CircuitBreaker`, evaluated lazily against the injected clock (no timers, no I/O):

    state      event                                              next
    ---------  -------------------------------------------------  -------------------------------
    closed     record(): >= min_requests in the last window_s and
               failures / total >= failure_ratio                  open until now + open_s
    closed     record(): otherwise                                closed
    open       clock reaches open_until                           half_open
    open       record() (late result of an earlier request)       open (ignored)
    half_open  allow() with < half_open_probes trials in flight   half_open (one more trial)
    half_open  allow() otherwise                                  half_open (refused)
    half_open  a trial unanswered for probe_timeout_s             half_open (its slot is freed)
    half_open  release(): a trial cut without a verdict          half_open (its slot is freed)
    half_open  record(ok=True)                                    closed (window cleared)
    half_open  record(ok=False)                                   open until now + open_s
    any        cool(s)                                            open until max(open_until, now + s)

An operator reset of one health key (`Breakers.reset("cloud:<provider>")`) forgets that provider's
target breakers and its *configured* failure domain (`failure_domains`, the provider's name when it has
none), which every provider sharing the domain shares; every other domain stays as it is.

Replicas share what they learnt through `Breakers.export()` / `merge()`: a plain-JSON map of open
breakers to their open-until times; merging keeps the later time, so a provider that rate-limited
one gateway replica is not hammered by the others.

Clocks: the breakers run on `clock`, a monotonic clock in production (`time.monotonic`), so a step
of the wall clock never opens, closes or stretches a breaker. Only the export speaks wall time
(epoch seconds from `wall`), because monotonic readings mean nothing in another process; each
side converts at the border (`until_wall = until + wall() - clock()`). Without `wall` the two are
the same clock.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Mapping
from typing import Any, Literal, cast

from pydantic import Field

from router.settings_base import StrictModel

Clock = Callable[[], float]
BreakerState = Literal["closed", "open", "half_open"]
Cause = Literal["failures", "cooling"]  # why a breaker is open: its own failure ratio, or a 429 cool-down

EXPORT_VERSION = 1
_CAUSES: tuple[Cause, ...] = ("failures", "cooling")


class BreakerSettings(StrictModel):
    # the `resilience.breaker` section of the config file (its description is the section's)

    window_s: float = Field(30.0, gt=0, description="outcomes considered (sliding window while closed)")
    min_requests: int = Field(5, ge=1, description="outcomes needed in the window before it can open")
    failure_ratio: float = Field(0.5, gt=0, le=1, description="share of failed outcomes in the window that opens it")
    open_s: float = Field(10.0, gt=0, description="open this long, then half-open")
    half_open_probes: int = Field(1, ge=1, description="trial requests let through when half-open")
    probe_timeout_s: float = Field(
        120.0,
        gt=0,
        description="a half-open trial whose outcome never arrives (its caller was cancelled) frees its slot "
        "after this long, so one lost request cannot wedge a breaker half-open; generous, as LLM calls stream "
        "for minutes",
    )


class CircuitBreaker:
    """Closed / open / half-open breaker over a sliding time window of outcomes.

    `min_sources` is how many distinct `source`s must have failed inside the window before the
    failure ratio may trip the breaker; domain breakers use 2 so that one broken model cannot close a
    whole provider endpoint to its healthy neighbours.
    """

    def __init__(self, settings: BreakerSettings, clock: Clock, *, min_sources: int = 1) -> None:
        self._settings = settings
        self._clock = clock
        self._min_sources = min_sources
        self._window: deque[tuple[float, bool, str]] = deque()  # (at, ok, source)
        self._failed: Counter[str] = Counter()  # failures in the window by source, kept as the window moves
        self._open_until: float | None = None  # None: closed; past: half-open
        self._cause: Cause = "failures"
        self._trials: deque[float] = deque()  # start times of half-open trials in flight

    # -- outputs ---------------------------------------------------------------------------------
    @property
    def state(self) -> BreakerState:
        return self._state_at(self._clock())

    @property
    def cause(self) -> Cause:
        """Why the breaker was last opened; meaningful while not closed."""
        return self._cause

    def open_until(self) -> float | None:
        """Clock reading until which the breaker refuses; None unless it is open right now."""
        now = self._clock()
        return self._open_until if self._state_at(now) == "open" else None

    def retry_in_s(self) -> float | None:
        now = self._clock()
        until = self._open_until if self._state_at(now) == "open" else None
        return None if until is None else until - now

    # -- admission -------------------------------------------------------------------------------
    def can_allow(self) -> bool:
        """Would `allow()` say yes? Reserves nothing, so a caller can check several breakers first."""
        now = self._clock()
        state = self._state_at(now)
        if state != "half_open":
            return state == "closed"
        self._expire_trials(now)
        return len(self._trials) < self._settings.half_open_probes

    def allow(self) -> bool:
        """Admit a request; while half-open this reserves one of the `half_open_probes` trial slots."""
        if not self.can_allow():
            return False
        now = self._clock()
        if self._state_at(now) == "half_open":
            self._trials.append(now)
        return True

    # -- inputs ----------------------------------------------------------------------------------
    def record(self, ok: bool, source: str = "") -> None:
        now = self._clock()
        state = self._state_at(now)
        if state == "open":
            return  # a request let through before the breaker opened; it proves nothing new
        if state == "half_open":
            if self._trials:
                self._trials.popleft()
            if ok:
                self._close()
            else:
                self._open(now + self._settings.open_s, "failures")
            return
        self._window.append((now, ok, source))
        if not ok:
            self._failed[source] += 1
        self._prune(now)
        if self._should_trip():
            self._open(now + self._settings.open_s, "failures")

    def release(self) -> None:
        """A half-open trial ended without a verdict (its request was cut by the gateway's timeout, or
        cancelled): its slot is free at once instead of after `probe_timeout_s`."""
        if self._trials and self._state_at(self._clock()) == "half_open":
            self._trials.pop()

    def cool(self, seconds: float) -> None:
        """Refuse everything for `seconds` (a 429's Retry-After), then go half-open. Never shortens."""
        now = self._clock()
        until = now + max(0.0, seconds)
        if self._state_at(now) == "open" and self._open_until is not None and self._open_until >= until:
            return
        self._open(until, "cooling")

    def hold_open(self, until: float, cause: Cause) -> bool:
        """Open until `until` unless already open at least that long (merging a peer's view)."""
        now = self._clock()
        if until <= now:
            return False
        if self._state_at(now) == "open" and self._open_until is not None and self._open_until >= until:
            return False
        self._open(until, cause)
        return True

    # -- internals -------------------------------------------------------------------------------
    def _state_at(self, now: float) -> BreakerState:
        if self._open_until is None:
            return "closed"
        return "open" if now < self._open_until else "half_open"

    def _open(self, until: float, cause: Cause) -> None:
        self._open_until = until
        self._cause = cause
        self._trials.clear()

    def _close(self) -> None:
        self._open_until = None
        self._window.clear()
        self._failed.clear()
        self._trials.clear()

    def _prune(self, now: float) -> None:
        horizon = now - self._settings.window_s
        while self._window and self._window[0][0] <= horizon:
            _, ok, source = self._window.popleft()
            if not ok:
                self._failed[source] -= 1
                if not self._failed[source]:
                    del self._failed[source]

    def _expire_trials(self, now: float) -> None:
        while self._trials and self._trials[0] + self._settings.probe_timeout_s <= now:
            self._trials.popleft()

    def _should_trip(self) -> bool:
        total = len(self._window)
        if total < self._settings.min_requests:
            return False
        # counted as outcomes come and go: a busy target's window holds thousands, read on every outcome
        if self._failed.total() / total < self._settings.failure_ratio:
            return False
        return len(self._failed) >= self._min_sources


class Breakers:
    """The board: one breaker per target id and one per failure domain, created on demand.

    `failure_domains` maps a provider's name to its configured failure domain (cloud.providers[].domain);
    a provider missing from it is its own domain, named like it. Only `reset` reads it: callers name the
    domain of every other call themselves.
    """

    def __init__(
        self,
        settings: BreakerSettings,
        clock: Clock,
        *,
        wall: Clock | None = None,
        failure_domains: Mapping[str, str] | None = None,
    ) -> None:
        self._settings = settings
        self._clock = clock
        self._wall = wall or clock
        self._failure_domains = dict(failure_domains or {})
        self._targets: dict[str, CircuitBreaker] = {}
        self._domains: dict[str, CircuitBreaker] = {}

    def target(self, target_id: str) -> CircuitBreaker:
        if target_id not in self._targets:
            self._targets[target_id] = CircuitBreaker(self._settings, self._clock)
        return self._targets[target_id]

    def domain(self, name: str) -> CircuitBreaker:
        if name not in self._domains:
            self._domains[name] = CircuitBreaker(self._settings, self._clock, min_sources=2)
        return self._domains[name]

    def allows(self, target_id: str, domain: str) -> tuple[bool, str]:
        """May a request go to `target_id` now? Reserves half-open trial slots only when both agree."""
        dom, tgt = self.domain(domain), self.target(target_id)
        if not dom.can_allow():
            return False, _refusal(f"domain {domain}", dom)
        if not tgt.can_allow():
            return False, _refusal(target_id, tgt)
        trials = [label for label, b in ((f"domain {domain}", dom), (target_id, tgt)) if b.state == "half_open"]
        dom.allow()
        tgt.allow()
        return True, f"half-open trial for {' and '.join(trials)}" if trials else ""

    def record(self, target_id: str, domain: str, ok: bool) -> None:
        self.target(target_id).record(ok)
        self.domain(domain).record(ok, source=target_id)

    def release(self, target_id: str, domain: str) -> None:
        """The half-open trial slots an attempt that ended without a verdict held (see `allows`)."""
        self.target(target_id).release()
        self.domain(domain).release()

    def cool_domain(self, domain: str, seconds: float) -> None:
        self.domain(domain).cool(seconds)

    def domain_of(self, key: str) -> str:
        """The failure domain of a health key: `cloud:<provider>` -> the provider's configured domain;
        `local:<alias>` is its own domain (named like the key)."""
        kind, _, name = key.partition(":")
        if kind == "cloud" and name:
            return self._failure_domains.get(name, name)
        return key

    def reset(self, key: str | None = None) -> list[str]:
        """Operator action: forget breakers: all of them, or those of one health key — its target ids
        (`<key>` and `<key>/...`) and its failure domain (`domain_of`). Returns what was forgotten."""
        out: list[str] = []
        domain = None if key is None else self.domain_of(key)
        for kind, board in (("target", self._targets), ("domain", self._domains)):
            for name in list(board):
                if kind == "target":
                    hit = key is None or name == key or name.startswith(f"{key}/")
                else:
                    hit = key is None or name == domain
                if hit:
                    del board[name]
                    out.append(f"{kind}:{name}")
        return out

    def states(self) -> dict[str, str]:
        out: dict[str, str] = {f"target:{k}": b.state for k, b in self._targets.items()}
        out.update({f"domain:{k}": b.state for k, b in self._domains.items()})
        return out

    def export(self) -> dict[str, Any]:
        """Plain JSON: every breaker open right now, with its open-until time and cause."""
        entries: dict[str, dict[str, Any]] = {}
        to_wall = self._wall() - self._clock()
        for prefix, board in (("target", self._targets), ("domain", self._domains)):
            for key, breaker in board.items():
                until = breaker.open_until()
                if until is not None:
                    entries[f"{prefix}:{key}"] = {"until": until + to_wall, "cause": breaker.cause}
        return {"version": EXPORT_VERSION, "open": entries}

    def merge(self, exported: dict[str, Any]) -> int:
        """Honour a peer's open breakers; keeps the later open-until. Returns how many changed here."""
        if not isinstance(exported, dict) or exported.get("version") != EXPORT_VERSION:
            raise ValueError(f"breaker export: expected {{'version': {EXPORT_VERSION}, 'open': {{...}}}}")
        entries = exported.get("open")
        if not isinstance(entries, dict):
            raise ValueError("breaker export: 'open' must be an object")
        changed = 0
        from_wall = self._clock() - self._wall()
        for key, entry in entries.items():
            prefix, _, name = str(key).partition(":")
            if prefix not in ("target", "domain") or not name:
                raise ValueError(f"breaker export: key {key!r} is not 'target:<id>' or 'domain:<name>'")
            if not isinstance(entry, dict) or not isinstance(entry.get("until"), int | float):
                raise ValueError(f"breaker export: {key}.until must be a number")
            cause = entry.get("cause", "failures")
            if cause not in _CAUSES:
                raise ValueError(f"breaker export: {key}.cause must be one of {_CAUSES}, got {cause!r}")
            breaker = self.target(name) if prefix == "target" else self.domain(name)
            changed += breaker.hold_open(float(entry["until"]) + from_wall, cast(Cause, cause))
        return changed


def _refusal(label: str, breaker: CircuitBreaker) -> str:
    retry = breaker.retry_in_s()
    if retry is None:  # half-open with every trial slot taken
        return f"breaker half-open for {label} (trial request in flight)"
    if breaker.cause == "cooling":
        return f"{label} cooling after 429 (retry in {retry:.1f}s)"
    return f"breaker open for {label} (retry in {retry:.1f}s)"
