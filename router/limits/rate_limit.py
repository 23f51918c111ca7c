"""A token bucket with an injected clock: a per-replica request rate (the feedback routes' limit,
serve_apps/learning/state.py).

`per_minute` tokens refill continuously; the bucket holds at most `burst` (default: one minute's worth).
Tenants' `requests_per_minute` is not counted here but in the store the gateway replicas share
(serve_apps/limits/tenants.py), so that N replicas do not allow N×.

The clock is monotonic (`time.monotonic`): a wall-clock step neither refills nor drains a bucket.
A rate below one request per minute is refused (config validation says so first): such a bucket
never holds a whole token, so the tenant could never send anything.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
    def __init__(self, per_minute: float, burst: float | None = None, clock: Callable[[], float] = time.monotonic):
        if not per_minute >= 1 or (burst is not None and not burst >= 1):
            raise ValueError(f"requests per minute and burst must be >= 1, got {per_minute}, {burst}")
        self._rate = per_minute / 60.0
        self._capacity = burst if burst is not None else per_minute
        self._tokens = self._capacity
        self._clock = clock
        self._last = clock()

    def take(self) -> float | None:
        """None when a request may go now, else the seconds until one may."""
        now = self._clock()
        self._tokens = min(self._capacity, self._tokens + (now - self._last) * self._rate)
        self._last = now
        if self._tokens >= 1:
            self._tokens -= 1
            return None
        return (1 - self._tokens) / self._rate
