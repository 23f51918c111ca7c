"""The caller's account limits a real provider enforces and reports on every answer, in the cloud simulator.

With `rpm_limit` / `tpm_limit` set, the simulator counts what it admitted in the last `limit_window_s` (60 s by
default, as a provider's minute; shorter in tests) — requests, and tokens
as a provider estimates them before answering: prompt words plus `max_tokens`, else the answer's length) and
sends OpenAI's headers on each answer, its 429s included:

    x-ratelimit-limit-requests / -tokens       the limit
    x-ratelimit-remaining-requests / -tokens   what is left after this request
    x-ratelimit-reset-requests / -tokens       until the window frees the oldest admission ("1.5s", "250ms")

A request past either limit is answered 429 `rate_limit_exceeded` with Retry-After (the reset), as OpenAI does;
it is not counted. A gateway that reads the headers stops sending before it meets that 429
(router/limits/rate_headers.py). Limits off (null): no headers, nothing counted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Admission:
    allowed: bool
    headers: dict[str, str]
    retry_after_s: float = 0.0


def duration(seconds: float) -> str:
    """OpenAI's reset format: "1.5s", or "250ms" under a second."""
    return f"{max(0, round(seconds * 1000))}ms" if seconds < 1 else f"{seconds:.3g}s"


class AccountLimits:
    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._admitted: deque[tuple[float, int]] = deque()  # (when, tokens)

    def reset(self) -> None:
        self._admitted.clear()

    def admit(self, rpm: int | None, tpm: int | None, tokens: int, window_s: float = 60.0) -> Admission:
        if rpm is None and tpm is None:
            return Admission(True, {})
        now = self._clock()
        while self._admitted and self._admitted[0][0] <= now - window_s:
            self._admitted.popleft()
        used_requests, used_tokens = len(self._admitted), sum(t for _, t in self._admitted)
        reset = (self._admitted[0][0] + window_s - now) if self._admitted else 0.0
        allowed = (rpm is None or used_requests < rpm) and (tpm is None or used_tokens + tokens <= tpm)
        if allowed:
            self._admitted.append((now, tokens))
            used_requests, used_tokens = used_requests + 1, used_tokens + tokens
            reset = self._admitted[0][0] + window_s - now
        headers: dict[str, str] = {}
        for axis, limit, used in (("requests", rpm, used_requests), ("tokens", tpm, used_tokens)):
            if limit is not None:
                headers[f"x-ratelimit-limit-{axis}"] = str(limit)
                headers[f"x-ratelimit-remaining-{axis}"] = str(max(0, limit - used))
                headers[f"x-ratelimit-reset-{axis}"] = duration(reset)
        return Admission(allowed, headers, 0.0 if allowed else max(reset, 0.001))
