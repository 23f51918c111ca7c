"""Where the gateway's CPU-bound request checks run: a small thread pool shared fairly by tenants.

A client's JSON Schemas are checked when its request's contract is derived (router/request/json_schema.py, up to
~2 s for the largest allowed schemas) and its answers are validated against them (router/output/output_contract.py,
at most 2 s each). Both are pure Python: on the default executor, eight requests with the largest schemas
held every worker and the GIL, and a request of another tenant queued behind them for 17-22 s.

`CheckPool.run(tenant, check, timeout_s=...)` runs `check` in one of `workers` threads:

* per-tenant admission: at most `per_tenant` checks of one tenant run at once; a tenant's further checks
  wait in that tenant's own queue, not in the pool's, so they never stand in front of another tenant's;
* fair hand-over: when a worker frees, the next check is taken round-robin over the tenants that wait
  (each tenant's own checks in order), so a tenant's check waits for at most one check per other
  waiting tenant — never behind one tenant's backlog;
* a time budget per check: `timeout_s` from the moment it starts (an output check 2 s + 1, a request's
  contract derive `DERIVE_BUDGET_S`; the checks also bound themselves, the schemas by their size);
  a check that overruns is answered `TimeoutError` (the derive: 400 `invalid_json_schema`) and keeps
  its worker until its thread ends, so a runaway check holds at most its tenant's share of the pool.

`RequestChecks` has two such pools: `schemas` for work on client schemas (deriving the contract of a
request that carries `tools` or a `response_format`, and every output check) and `plain` for deriving
the contract of every other request, so a request without schemas never queues behind schema work.
A request without schemas whose body is at most `INLINE_DERIVE_BYTES` is derived on the event loop instead:
its derive is bounded by its message count, ~1 µs a message (at most ~1 ms at that size, tens of µs for most),
less than the hop to a thread and back.
The clock is the event loop's; the pool holds no state but its queues.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from router.error_codes import ErrorCode
from router.errors import InvalidRequest

log = logging.getLogger("spillover.checks")
T = TypeVar("T")
DERIVE_BUDGET_S = 10.0  # one request's contract derive, once running (its schemas: ~2 s at the size bound)
INLINE_DERIVE_BYTES = 32 * 1024  # a body without schemas up to this size is derived on the loop (module docstring)


class CheckRunner(Protocol):
    async def run(self, tenant: str, check: Callable[[], T], *, timeout_s: float | None = None) -> T: ...


class Unpooled:
    """Every check on the default executor, for callers outside the request path (the dry-run)."""

    async def run(self, tenant: str, check: Callable[[], T], *, timeout_s: float | None = None) -> T:
        return await asyncio.wait_for(asyncio.to_thread(check), timeout_s)


class CheckPool:
    def __init__(
        self, workers: int = 2, per_tenant: int = 1, *, executor: Executor | None = None, name: str = "checks"
    ) -> None:
        if workers < 1 or per_tenant < 1:
            raise ValueError("workers and per_tenant must be >= 1")
        self.workers = workers
        self.per_tenant = min(per_tenant, workers)
        self._executor = executor or ThreadPoolExecutor(workers, thread_name_prefix=f"spillover-{name}")
        self._busy = 0
        self._running: Counter[str] = Counter()
        self._waiting: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()

    def waiting(self, tenant: str | None = None) -> int:
        """Checks admitted to no worker yet (of `tenant`, or of everyone)."""
        queues = self._waiting.values() if tenant is None else [self._waiting.get(tenant, deque())]
        return sum(len(q) for q in queues)

    def running(self, tenant: str | None = None) -> int:
        return self._busy if tenant is None else self._running[tenant]

    async def run(self, tenant: str, check: Callable[[], T], *, timeout_s: float | None = None) -> T:
        """`check()` in a worker thread, once this tenant's turn comes; raises `TimeoutError` past
        `timeout_s` of running (the worker stays taken until the check's thread ends)."""
        await self._admit(tenant)
        loop = asyncio.get_running_loop()
        try:
            future: Future[T] = self._executor.submit(check)
        except BaseException:
            self._leave(tenant)
            raise
        future.add_done_callback(lambda _: _call_soon(loop, self._leave, tenant))
        return await asyncio.wait_for(asyncio.wrap_future(future), timeout_s)

    def _free_for(self, tenant: str) -> bool:
        return self._busy < self.workers and self._running[tenant] < self.per_tenant

    def _start(self, tenant: str) -> None:
        self._busy += 1
        self._running[tenant] += 1

    async def _admit(self, tenant: str) -> None:
        if not self._waiting.get(tenant) and self._free_for(tenant):
            self._start(tenant)
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(tenant, deque()).append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._leave(tenant)  # admitted just as it was cancelled: give the worker on
            else:
                self._forget(tenant, waiter)
            raise

    def _forget(self, tenant: str, waiter: asyncio.Future[None]) -> None:
        queue = self._waiting.get(tenant)
        if queue is not None and waiter in queue:
            queue.remove(waiter)
            if not queue:
                del self._waiting[tenant]

    def _leave(self, tenant: str) -> None:
        self._busy -= 1
        self._running[tenant] -= 1
        if self._running[tenant] <= 0:
            del self._running[tenant]
        self._hand_over()

    def _hand_over(self) -> None:
        """Wake waiting checks, round-robin over their tenants, while workers are free."""
        while self._busy < self.workers:
            tenant = next((t for t in self._waiting if self._running[t] < self.per_tenant), None)
            if tenant is None:
                return
            queue = self._waiting.pop(tenant)
            waiter = queue.popleft()
            if queue:
                self._waiting[tenant] = queue  # to the end of the round
            if not waiter.done():
                self._start(tenant)
                waiter.set_result(None)


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the loop is closed (shutdown): nothing waits any more
        log.debug("check finished after its event loop closed")


class RequestChecks:
    """The two pools of a gateway replica (see the module docstring)."""

    def __init__(
        self,
        schemas: CheckPool | None = None,
        plain: CheckPool | None = None,
        *,
        derive_budget_s: float = DERIVE_BUDGET_S,
    ) -> None:
        self.schemas = schemas or CheckPool(name="schema-checks")
        self.plain = plain or CheckPool(2, 2, name="plain-checks")
        self._budget_s = derive_budget_s

    @classmethod
    def from_settings(cls, workers: int, per_tenant: int, *, auth: bool) -> RequestChecks:
        # without auth every request is one tenant's: its share is the whole pool
        share = per_tenant if auth else workers
        return cls(CheckPool(workers, share, name="schema-checks"), CheckPool(workers, share, name="plain-checks"))

    def for_body(self, body: Mapping[str, Any]) -> CheckPool:
        """The pool that derives a request's contract: `schemas` when it carries any."""
        carries = body.get("tools") is not None or body.get("response_format") is not None
        return self.schemas if carries else self.plain

    async def derive(
        self, tenant: str, body: Mapping[str, Any], derive: Callable[[], T], *, size: int | None = None
    ) -> T:
        """`derive()` (the contract of `body`, `size` bytes of JSON) in `tenant`'s turn, or at once on the loop for a
        small body without schemas; a derive still running after `derive_budget_s` is 400 `invalid_json_schema` (the
        size bound keeps a real one near 2 s)."""
        pool = self.for_body(body)
        if pool is self.plain and size is not None and size <= INLINE_DERIVE_BYTES:
            return derive()
        try:
            return await pool.run(tenant, derive, timeout_s=self._budget_s)
        except TimeoutError:
            raise InvalidRequest(
                f"the request's JSON Schemas could not be checked within {self._budget_s:g}s: send smaller schemas",
                param="tools" if body.get("tools") is not None else "response_format",
                code=ErrorCode.INVALID_JSON_SCHEMA,
            ) from None
