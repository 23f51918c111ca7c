"""Breaker state shared by the gateway replicas: a small named Ray actor.

With N gateway replicas, each holds its own breakers. A provider that failed (or answered 429) on
one replica should not be hammered by the others, so every replica, every
`resilience.share_period_s`, pushes `Breakers.export()` (its open breakers with their open-until
times) to the exchange and merges what the other replicas pushed (`Breakers.merge` keeps the later
time). A breaker opened on one replica is therefore honoured by every other one within
2 × share_period_s — one push, then the other's next pull — tested in
tests/unit/test_breaker_exchange.py.

An operator reset (`POST /v1/spillover/resilience/reset`) bumps the exchange's epoch, notes what was
reset (a health key such as `cloud:<provider>`, or everything) and drops every stored export; a replica
that sees a newer epoch asks for the resets it missed (`resets_since`) and forgets the same breakers
of its own — a provider's targets and its configured failure domain (`Breakers.reset`), every other
domain's breakers kept — so a reset on one replica is not undone by the copies the others hold, and
does not close more on the others than on the replica that was asked. The exchange keeps the last
`RESETS_KEPT` resets; a replica that missed more forgets everything.

Everything else stays per replica, with these bounds: health machines (each replica probes every
target itself, so they agree within a probe period), the retry budget (ratio per replica, so the
gateway-wide share of retries is the same), provider RPM/TPM windows (set `rpm`/`tpm` to the
provider's limit divided by `gateway.replicas`) and decision records (`GET /v1/spillover/decisions/{id}`
on the replica that answered). Spend goes to one SQLite file per node; stored idempotent answers live in
the shared store (router/request/idempotency.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import ray
from ray.actor import ActorHandle

from router.resilience.breaker import Breakers
from serve_apps.head_actor import call, command_call, on_head

log = logging.getLogger("spillover.breaker_exchange")

EXCHANGE_NAME = "spillover-breakers"
EXCHANGE_NAMESPACE = "spillover"
RESETS_KEPT = 64  # resets remembered for replicas that have not synced since (one share period each)


class BreakerExchange:
    """Latest export per gateway replica; replicas silent for `forget_after_s` are dropped."""

    def __init__(self, clock: Callable[[], float] = time.time, forget_after_s: float = 60.0) -> None:
        self._clock = clock
        self._forget_after_s = forget_after_s
        self._exports: dict[str, tuple[float, dict[str, Any]]] = {}
        self._resets: dict[int, str | None] = {}  # epoch -> the health key reset then (None: everything)
        self.epoch = 0

    def swap(self, replica: str, export: dict[str, Any], epoch_seen: int) -> tuple[int, list[dict[str, Any]]]:
        """Store `replica`'s export (unless it predates the last reset) and return the current epoch
        with the other replicas' exports."""
        now = self._clock()
        if epoch_seen == self.epoch:
            self._exports[replica] = (now, export)
        cutoff = now - self._forget_after_s
        self._exports = {r: (t, e) for r, (t, e) in self._exports.items() if t >= cutoff}
        return self.epoch, [e for r, (_, e) in self._exports.items() if r != replica]

    def reset(self, key: str | None = None) -> int:
        """An operator reset of one health key (`cloud:<provider>`, `local:<alias>`) or of everything."""
        self.epoch += 1
        self._exports.clear()
        self._resets[self.epoch] = key
        self._resets.pop(self.epoch - RESETS_KEPT, None)
        return self.epoch

    def resets_since(self, epoch_seen: int) -> tuple[int, list[str | None]]:
        """The current epoch and the keys reset after `epoch_seen`, oldest first; `[None]` (everything)
        when some of them are no longer kept."""
        missed = range(epoch_seen + 1, self.epoch + 1)
        if any(epoch not in self._resets for epoch in missed):
            return self.epoch, [None]
        return self.epoch, [self._resets[epoch] for epoch in missed]


def get_or_create_exchange() -> ActorHandle:
    actor = ray.remote(num_cpus=0, max_concurrency=16)(BreakerExchange)  # type: ignore[call-overload]  # see board
    return on_head(actor, EXCHANGE_NAME, EXCHANGE_NAMESPACE)


def kill_exchange() -> None:
    try:
        ray.kill(ray.get_actor(EXCHANGE_NAME, namespace=EXCHANGE_NAMESPACE))
    except ValueError:
        pass  # never created


Swap = Callable[[str, dict[str, Any], int], Awaitable[tuple[int, list[dict[str, Any]]]]]
ResetsSince = Callable[[int], Awaitable[tuple[int, list[str | None]]]]


class BreakerSync:
    """One gateway replica's side: push, merge, and follow resets. `swap` and `resets_since` are the
    exchange's methods (Ray actor calls in production, a plain object in tests); without
    `resets_since` a reset anywhere forgets every breaker here."""

    def __init__(
        self,
        breakers: Breakers,
        swap: Swap,
        replica: str,
        *,
        period_s: float,
        resets_since: ResetsSince | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._breakers = breakers
        self._swap = swap
        self._resets_since = resets_since
        self._replica = replica
        self._period_s = period_s
        self._sleep = sleep
        self._epoch = 0

    async def once(self) -> int:
        """One exchange; returns how many breakers changed here."""
        epoch, others = await self._swap(self._replica, self._breakers.export(), self._epoch)
        if epoch != self._epoch:  # an operator reset somewhere: forget our copies of what it reset
            keys: list[str | None] = [None]
            if self._resets_since is not None:
                epoch, keys = await self._resets_since(self._epoch)
            for key in dict.fromkeys(keys):
                self._breakers.reset(key)
            self._epoch = epoch
            return 0
        changed = 0
        for export in others:
            try:
                changed += self._breakers.merge(export)
            except ValueError as exc:  # a replica of another version: skip it, keep serving
                log.warning("breaker export from a peer ignored: %s", exc)
        return changed

    async def run(self) -> None:
        while True:
            try:
                await self.once()
            except Exception as exc:  # noqa: BLE001 -- the exchange being away must not stop the gateway
                log.warning("breaker exchange unavailable: %s", type(exc).__name__)
            await self._sleep(self._period_s)


def ray_swap(exchange: ActorHandle) -> Swap:
    async def swap(replica: str, export: dict[str, Any], epoch: int) -> tuple[int, list[dict[str, Any]]]:
        return await call(exchange.swap.remote(replica, export, epoch))

    return swap


def ray_reset(exchange: ActorHandle) -> Callable[[str | None], Awaitable[int]]:
    """An operator's reset, told to the other gateway replicas through the exchange (bounded: 503 when hung)."""

    async def reset(key: str | None) -> int:
        return await command_call(exchange.reset.remote(key), "the breaker exchange (it tells the other replicas)")

    return reset


def ray_resets_since(exchange: ActorHandle) -> ResetsSince:
    async def resets_since(epoch: int) -> tuple[int, list[str | None]]:
        return await call(exchange.resets_since.remote(epoch))

    return resets_since
