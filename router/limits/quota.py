"""Per cloud provider request and token quotas (RPM / TPM), checked before a request is sent.

Cloud providers refuse traffic beyond their requests-per-minute and tokens-per-minute limits
with a 429. Finding that out by sending wastes a round trip and, worse, a fallback slot; so the
gateway keeps its own sliding window of what it sent to each provider and asks it first. A
refusal carries `retry_in_s` (when enough of the window will have slid out) so the caller can
choose another target now, or wait, instead of guessing.

The token count reserved before sending is an estimate (prompt tokens + max_tokens, the most
the request can use); `settle` replaces it with the provider's reported usage once known, so
the window tracks reality rather than the pessimistic bound.

The provider's own account of its limits feeds the same window: `observe` takes what its
rate-limit response headers said (`router.limits.rate_headers`: requests and tokens remaining, and when
they refill) and, until that reset, refuses what the provider would refuse, counting down what is
sent meanwhile. A later reading replaces an earlier one.

Pure: no I/O, no awaits, the clock is injected. Not thread-safe: one event loop owns a
`Quotas`. Its windows are this replica's own: the gateway enforces the configured `rpm` / `tpm` in the
store its replicas share (serve_apps/limits/provider_quotas.py) and keeps a `Quotas` without limits for
the providers' headers (`observe`, per replica) and for what this replica sent (`usage`).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from router.limits.rate_headers import RateLimitReading, Remaining


@dataclass(frozen=True)
class Reservation:
    """A request admitted into a provider's window; hand it back to `settle`."""

    id: int
    provider: str
    tokens: int
    at: float


@dataclass(frozen=True)
class Refusal:
    """A request that does not fit the window now.

    `retry_in_s` is the wait after which it would fit if nothing else is sent meanwhile; None
    when waiting cannot help (the request alone is larger than the token limit).
    """

    provider: str
    reason: str
    retry_in_s: float | None


@dataclass
class _Reported:
    """What the provider said is left on one axis, counted down by what we sent since, until `until`."""

    left: int
    until: float


@dataclass
class _Entry:
    id: int
    at: float
    tokens: int


class ProviderQuota:
    """A sliding window of the requests and tokens sent to one provider.

    `rpm` / `tpm` of None mean unlimited on that axis; the window is still kept so `usage()`
    can report traffic for metrics.
    """

    def __init__(
        self,
        *,
        rpm: int | None,
        tpm: int | None,
        clock: Callable[[], float],
        window_s: float = 60.0,
        name: str = "provider",
    ) -> None:
        for label, value in (("rpm", rpm), ("tpm", tpm)):
            if value is not None and value < 1:
                raise ValueError(f"{name}: {label} must be >= 1 or None, got {value}")
        if window_s <= 0:
            raise ValueError(f"{name}: window_s must be > 0, got {window_s}")
        self.name = name
        self.rpm = rpm
        self.tpm = tpm
        self.window_s = window_s
        self._clock = clock
        self._entries: deque[_Entry] = deque()  # oldest first
        self._by_id: dict[int, _Entry] = {}
        self._tokens = 0  # sum of tokens over _entries, kept incrementally
        self._ids: Iterator[int] = itertools.count(1)
        self._reported: dict[str, _Reported] = {}  # "requests" / "tokens" -> the provider's last word

    def observe(self, reading: RateLimitReading) -> None:
        """Apply the provider's rate-limit headers: until each axis resets (a reading without a reset
        holds for one window), no more than it said is left is sent."""
        now = self._clock()
        for axis, remaining in (("requests", reading.requests), ("tokens", reading.tokens)):
            if remaining is not None:
                self._reported[axis] = self._holding(remaining, now)

    def _holding(self, remaining: Remaining, now: float) -> _Reported:
        reset = self.window_s if remaining.reset_s is None else remaining.reset_s
        return _Reported(remaining.count, now + reset)

    def _reported_left(self, axis: str, now: float) -> _Reported | None:
        reported = self._reported.get(axis)
        if reported is not None and now >= reported.until:
            del self._reported[axis]
            return None
        return reported

    def reported(self) -> dict[str, dict[str, float]]:
        """The provider's last word still in force per axis: what is left and seconds to its reset."""
        now = self._clock()
        out = {}
        for axis in ("requests", "tokens"):
            reported = self._reported_left(axis, now)
            if reported is not None:
                out[axis] = {"left": reported.left, "reset_in_s": round(reported.until - now, 3)}
        return out

    def _prune(self, now: float) -> None:
        """Drop the entries that slid out of the window (at <= now - window)."""
        horizon = now - self.window_s
        while self._entries and self._entries[0].at <= horizon:
            old = self._entries.popleft()
            self._tokens -= old.tokens
            del self._by_id[old.id]

    def _window_label(self) -> str:
        return f"{self.window_s:g}s"

    def try_reserve(self, tokens: int) -> Reservation | Refusal:
        """Admit one request of up to `tokens` tokens, or say why not and for how long.

        On admission the request is recorded at once, so two requests checked back to back
        cannot both take the last slot.
        """
        if tokens < 0:
            raise ValueError(f"{self.name}: tokens must be >= 0, got {tokens}")
        if self.tpm is not None and tokens > self.tpm:
            return Refusal(
                self.name,
                f"{self.name}: request needs {tokens} tokens, more than the limit of "
                f"{self.tpm} tokens per {self._window_label()}",
                None,
            )
        now = self._clock()
        self._prune(now)
        reasons: list[str] = []
        retry_in = 0.0
        if self.rpm is not None and len(self._entries) + 1 > self.rpm:
            reasons.append(f"{self.name}: {len(self._entries)}/{self.rpm} requests in the last {self._window_label()}")
            # The window has room once enough of the oldest entries left it.
            must_leave = len(self._entries) + 1 - self.rpm
            retry_in = max(retry_in, self._leaves_in(self._entries[must_leave - 1], now))
        if self.tpm is not None and self._tokens + tokens > self.tpm:
            reasons.append(
                f"{self.name}: {self._tokens}/{self.tpm} tokens in the last {self._window_label()}, "
                f"request needs {tokens}"
            )
            retry_in = max(retry_in, self._tokens_free_in(tokens, now))
        told_requests, told_tokens = self._reported_left("requests", now), self._reported_left("tokens", now)
        if told_requests is not None and told_requests.left < 1:
            reasons.append(f"{self.name}: the provider reports no requests left for {told_requests.until - now:.1f}s")
            retry_in = max(retry_in, told_requests.until - now)
        if told_tokens is not None and tokens > told_tokens.left:
            reasons.append(
                f"{self.name}: the provider reports {told_tokens.left} tokens left for "
                f"{told_tokens.until - now:.1f}s, request needs {tokens}"
            )
            retry_in = max(retry_in, told_tokens.until - now)
        if reasons:
            return Refusal(self.name, "; ".join(reasons), retry_in)
        if told_requests is not None:
            told_requests.left -= 1
        if told_tokens is not None:
            told_tokens.left -= tokens
        entry = _Entry(next(self._ids), now, tokens)
        self._entries.append(entry)
        self._by_id[entry.id] = entry
        self._tokens += tokens
        return Reservation(entry.id, self.name, tokens, now)

    def cancel(self, reservation: Reservation) -> None:
        """Take back a reservation that was not sent after all (a later check refused it): out of the window,
        and what it took of the provider's reported counts given back."""
        entry = self._by_id.pop(reservation.id, None)
        if entry is None:
            return
        self._entries.remove(entry)
        self._tokens -= entry.tokens
        now = self._clock()
        told_requests, told_tokens = self._reported_left("requests", now), self._reported_left("tokens", now)
        if told_requests is not None:
            told_requests.left += 1
        if told_tokens is not None:
            told_tokens.left += entry.tokens

    def _leaves_in(self, entry: _Entry, now: float) -> float:
        return max(0.0, entry.at + self.window_s - now)

    def _tokens_free_in(self, tokens: int, now: float) -> float:
        """Seconds until enough of the oldest entries leave for `tokens` more to fit."""
        assert self.tpm is not None
        excess = self._tokens + tokens - self.tpm
        freed = 0
        for entry in self._entries:
            freed += entry.tokens
            if freed >= excess:
                return self._leaves_in(entry, now)
        # Unreachable while tokens <= tpm (every entry leaving frees all of _tokens);
        # a full window is the safe answer.
        return self.window_s

    def settle(self, reservation: Reservation, actual_tokens: int) -> None:
        """Replace a reservation's estimate by the tokens the provider reported.

        A reservation that already left the window, or was settled before, is simply updated
        (or ignored): settling late cannot distort the current window.
        """
        if actual_tokens < 0:
            raise ValueError(f"{self.name}: actual_tokens must be >= 0, got {actual_tokens}")
        self._prune(self._clock())
        entry = self._by_id.get(reservation.id)
        if entry is None:
            return
        self._tokens += actual_tokens - entry.tokens
        entry.tokens = actual_tokens

    def usage(self) -> tuple[int, int]:
        """(requests, tokens) in the current window, for metrics."""
        self._prune(self._clock())
        return len(self._entries), self._tokens


class Quotas:
    """The `ProviderQuota` of each cloud provider, keyed by provider name.

    Built from `{name: (rpm, tpm)}`. A provider without configured limits gets an unlimited
    quota on first use, so callers never branch on "has a quota" and its traffic still shows
    in `usage()`.
    """

    def __init__(
        self,
        limits: Mapping[str, tuple[int | None, int | None]],
        *,
        clock: Callable[[], float],
        window_s: float = 60.0,
    ) -> None:
        self._clock = clock
        self._window_s = window_s
        self._quotas: dict[str, ProviderQuota] = {
            name: ProviderQuota(rpm=rpm, tpm=tpm, clock=clock, window_s=window_s, name=name)
            for name, (rpm, tpm) in limits.items()
        }

    def __getitem__(self, provider: str) -> ProviderQuota:
        quota = self._quotas.get(provider)
        if quota is None:
            quota = ProviderQuota(rpm=None, tpm=None, clock=self._clock, window_s=self._window_s, name=provider)
            self._quotas[provider] = quota
        return quota

    def __contains__(self, provider: object) -> bool:
        return provider in self._quotas

    def try_reserve(self, provider: str, tokens: int) -> Reservation | Refusal:
        return self[provider].try_reserve(tokens)

    def settle(self, reservation: Reservation, actual_tokens: int) -> None:
        self[reservation.provider].settle(reservation, actual_tokens)

    def cancel(self, reservation: Reservation) -> None:
        self[reservation.provider].cancel(reservation)

    def usage(self) -> dict[str, tuple[int, int]]:
        """(requests, tokens) in the current window per provider, for metrics."""
        return {name: quota.usage() for name, quota in self._quotas.items()}

    def observe(self, provider: str, reading: RateLimitReading) -> None:
        self[provider].observe(reading)

    def reported(self) -> dict[str, dict[str, dict[str, float]]]:
        """Per provider, its rate-limit headers still in force (providers that sent none left out)."""
        return {name: told for name, quota in self._quotas.items() if (told := quota.reported())}
