"""Provider RPM / TPM counted by every gateway replica together, in the shared store.

`cloud.providers[].rpm` / `.tpm` are the provider's own limits, for the whole gateway: each is a fixed
window in the shared store (serve_apps/state/store.py `window_add`), so N gateway replicas — however many
the autoscaler runs — together send no more than the limit, and none needs to know how many there are.

* `try_reserve(provider, tokens)`: one `window_add` of 1 with the `rpm` limit, then one of the estimate
  (prompt + max_tokens) with the `tpm` limit — one store operation per limit, none for a provider
  without limits. A request refused on tokens gives its request back (`window_adjust`, off the request's
  path), so a refusal costs the window nothing.
* `settle(reservation, actual)`: the estimate is replaced by the provider's reported usage with one
  `window_adjust` of `actual - estimate` on the window the reservation was counted in. It runs as a task
  of its own (the caller is the answer's path, synchronous: serve_apps/streams/record.py); `flush()` waits.

The refusals read as before (router/limits/quota.py): which limit, how much of it the window holds, and
`retry_in_s` — here the time until the window rolls over. A request alone larger than `tpm` is refused at
once with no retry, as before.

Why two pieces: the windows that must be exact live in the store; what a provider's rate-limit headers
said (`observe`: requests and tokens left until a reset) stays per replica in a pure `Quotas` without
limits (router/limits/quota.py) — each replica hears only its own responses' headers, and a reading is a
snapshot the provider already shares across all callers, so counting it down per replica errs on the side
of sending less. That `Quotas` also keeps this replica's own traffic for `usage()` (metrics, views).

While the store does not answer, the fallback store (serve_apps/state/fallback.py) counts the windows in
this replica's memory: each replica then enforces the whole limit on its own until the store is back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from router.errors import StoreUnavailable
from router.limits.quota import ProviderQuota, Quotas, Refusal, Reservation
from router.limits.rate_headers import RateLimitReading
from serve_apps.state.store import SharedStore
from serve_apps.state.timing import off_path

log = logging.getLogger("spillover.limits")

MAX_PENDING = 100_000  # reservations awaiting their settle (oldest forgotten past it)


class SharedQuotas:
    def __init__(
        self,
        limits: Mapping[str, tuple[int | None, int | None]],
        store: SharedStore,
        *,
        clock: Callable[[], float],
        window_s: float = 60.0,
    ) -> None:
        self._limits = dict(limits)
        self._store = store
        self._window_s = window_s
        self.local = Quotas({name: (None, None) for name in limits}, clock=clock, window_s=window_s)
        self._pending: dict[tuple[str, int], int] = {}  # (provider, reservation id) -> its tokens window
        self._adjusts: set[asyncio.Task[None]] = set()

    def _label(self) -> str:
        return f"{self._window_s:g}s"

    def __getitem__(self, provider: str) -> ProviderQuota:
        return self.local[provider]

    async def try_reserve(self, provider: str, tokens: int) -> Reservation | Refusal:
        """Admit one request of up to `tokens` tokens to `provider`, or say why not and for how long."""
        rpm, tpm = self._limits.get(provider, (None, None))
        if tpm is not None and tokens > tpm:
            return Refusal(
                provider,
                f"{provider}: request needs {tokens} tokens, more than the limit of {tpm} tokens per {self._label()}",
                None,
            )
        reserved = self.local.try_reserve(provider, tokens)  # the provider's headers, and this replica's usage
        if isinstance(reserved, Refusal):
            return reserved
        requests_window: int | None = None
        if rpm is not None:
            requests = await self._store.window_add(_key(provider, "requests"), 1, rpm, self._window_s)
            if not requests.allowed:
                self.local.cancel(reserved)
                return Refusal(
                    provider,
                    f"{provider}: {int(requests.used)}/{rpm} requests in this {self._label()} window "
                    "(all gateway replicas)",
                    requests.retry_in_s,
                )
            requests_window = requests.window
        if tpm is not None:
            counted = await self._store.window_add(_key(provider, "tokens"), tokens, tpm, self._window_s)
            if not counted.allowed:
                self.local.cancel(reserved)
                if requests_window is not None:
                    self._later(_key(provider, "requests"), requests_window, -1)
                return Refusal(
                    provider,
                    f"{provider}: {int(counted.used)}/{tpm} tokens in this {self._label()} window "
                    f"(all gateway replicas), request needs {tokens}",
                    counted.retry_in_s,
                )
            if len(self._pending) >= MAX_PENDING:
                self._pending.pop(next(iter(self._pending)))
            self._pending[(provider, reserved.id)] = counted.window
        return reserved

    def settle(self, reservation: Reservation, actual_tokens: int) -> None:
        """Replace a reservation's estimate by the tokens the provider reported (once; later calls are ignored)."""
        self.local.settle(reservation, actual_tokens)
        window = self._pending.pop((reservation.provider, reservation.id), None)
        if window is not None and actual_tokens != reservation.tokens:
            self._later(_key(reservation.provider, "tokens"), window, actual_tokens - reservation.tokens)

    def _later(self, key: str, window: int, delta: float) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop (a synchronous caller): the window keeps the estimate
            return
        task = loop.create_task(self._adjust(key, window, delta), context=off_path())  # not the request's time
        self._adjusts.add(task)
        task.add_done_callback(self._adjusts.discard)

    async def _adjust(self, key: str, window: int, delta: float) -> None:
        try:
            await self._store.window_adjust(key, window, delta, self._window_s)
        except StoreUnavailable as exc:  # a bare store (no fallback): the window keeps the estimate
            log.warning("quota window %s not adjusted by %g: %s", key, delta, exc.message)

    async def flush(self) -> None:
        """Wait until every adjustment asked for so far has reached the store."""
        while self._adjusts:
            await asyncio.gather(*list(self._adjusts))

    def observe(self, provider: str, reading: RateLimitReading) -> None:
        self.local.observe(provider, reading)

    def usage(self) -> dict[str, tuple[int, int]]:
        """(requests, tokens) this replica sent in the last window per provider, for metrics."""
        return self.local.usage()

    def reported(self) -> dict[str, dict[str, dict[str, float]]]:
        return self.local.reported()


def _key(provider: str, axis: str) -> str:
    return f"provider-{axis}:{provider}"
