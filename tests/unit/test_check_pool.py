"""The pool of CPU-bound request checks (serve_apps/off_loop/check_pool.py): per-tenant admission, round-robin
hand-over between tenants, a time budget per check, and through the gateway's real HTTP layer: one
tenant's eight requests with large schemas never put another tenant's request behind them.

No timing assertions: the executors here are fakes of `concurrent.futures` executors — one runs a
submitted check only when the test says (`ManualExecutor`), one runs it in a real worker thread once a
gate opens (`GatedExecutor`) — and the tests count what is running and what waits."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any

import pytest

from router.errors import InvalidRequest
from serve_apps.off_loop.check_pool import INLINE_DERIVE_BYTES, CheckPool, RequestChecks
from tests.unit.security_gateway import APPS, BOUND_S, MODEL, OTHER, build


class ManualExecutor(Executor):
    """Like a thread pool with a free worker for every check submitted (the pool never submits more
    than it has workers): the check is running at once (it cannot be cancelled any more), and it ends
    only when `finish` says so."""

    def __init__(self) -> None:
        self.jobs: list[tuple[Callable[[], Any], Future[Any]]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_running_or_notify_cancel()
        self.jobs.append((lambda: fn(*args, **kwargs), future))
        return future

    def labels(self) -> list[Any]:
        return [fn() for fn, _ in self.jobs]

    def finish(self, label: Any) -> None:
        (index,) = [i for i, (fn, _) in enumerate(self.jobs) if fn() == label]
        fn, future = self.jobs.pop(index)
        future.set_result(fn())


class GatedExecutor(ThreadPoolExecutor):
    """A real thread pool whose workers start each check only once `gate` is set."""

    def __init__(self, workers: int) -> None:
        super().__init__(workers)
        self.gate = threading.Event()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        def gated() -> Any:
            self.gate.wait(BOUND_S)
            return fn(*args, **kwargs)

        return super().submit(gated)


async def until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + BOUND_S
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.005)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_tenant_waits_in_its_own_queue_and_freed_workers_go_round_robin() -> None:
    executor = ManualExecutor()
    pool = CheckPool(2, 1, executor=executor)
    runs = {
        label: asyncio.create_task(pool.run(label[0], lambda label=label: label))
        for label in ("a0", "a1", "a2", "b0", "b1", "c0")
    }
    await settle()
    assert executor.labels() == ["a0", "b0"]  # one per tenant, every worker taken
    assert (pool.waiting("a"), pool.waiting("b"), pool.waiting("c")) == (2, 1, 1)
    executor.finish("a0")
    await settle()
    assert executor.labels() == ["b0", "a1"]
    executor.finish("b0")
    await settle()
    assert executor.labels() == ["a1", "b1"]  # b before c: it waited first
    executor.finish("a1")
    await settle()
    assert executor.labels() == ["b1", "c0"]  # c before a's backlog
    for label in ("b1", "c0"):
        executor.finish(label)
    await settle()
    executor.finish("a2")
    assert [await runs[label] for label in sorted(runs)] == sorted(runs)
    assert pool.running() == 0 and pool.waiting() == 0


async def test_a_cancelled_wait_frees_its_place_and_an_overrunning_check_keeps_its_worker() -> None:
    executor = ManualExecutor()
    pool = CheckPool(1, 1, executor=executor)
    slow = asyncio.create_task(pool.run("a", lambda: "slow", timeout_s=0.01))
    queued = asyncio.create_task(pool.run("b", lambda: "queued"))
    await settle()
    with pytest.raises(TimeoutError):
        await slow  # over its budget: the caller stops waiting ...
    queued.cancel()
    await settle()
    assert executor.labels() == ["slow"] and pool.running("a") == 1 and pool.waiting() == 0  # ... the thread runs on
    executor.finish("slow")
    await settle()
    assert pool.running() == 0
    after = asyncio.create_task(pool.run("b", lambda: "next"))
    await settle()
    executor.finish("next")
    assert await after == "next"


def schema(properties: int) -> dict[str, Any]:
    return {"type": "object", "properties": {f"p{i}": {"type": "string", "minLength": 1} for i in range(properties)}}


def with_schema(properties: int) -> dict[str, Any]:
    spec = {"name": "s", "schema": schema(properties)}
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "x"}],
        "response_format": {"type": "json_schema", "json_schema": spec},
    }


@pytest.mark.realtime  # its held checks run on the derive budget (wall clock): scripts/test runs it at normal priority
async def test_check_pool_isolates_tenants() -> None:
    """Eight requests of one tenant with large schemas (the derive of each checks its schema in the pool;
    the gate holds them there): a request of another tenant without schemas is answered meanwhile, and
    one with a schema starts its check on the next free worker, before the first tenant's backlog."""
    gated = GatedExecutor(2)
    schemas = CheckPool(2, 1, executor=gated, name="test-schemas")
    gateway = build(checks=RequestChecks(schemas, CheckPool(2, 1, name="test-plain")))
    started = time.monotonic()
    async with gateway.client() as client:
        post = client.post
        heavy = [
            asyncio.create_task(post("/v1/chat/completions", json=with_schema(300), headers=APPS)) for _ in range(8)
        ]
        await until(lambda: schemas.running("apps") == 1 and schemas.waiting("apps") == 7)
        plain = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        alone = await post("/v1/chat/completions", json=plain, headers=OTHER)  # every schema check still gated
        assert alone.status_code == 200 and schemas.waiting("apps") == 7
        small = asyncio.create_task(post("/v1/chat/completions", json=with_schema(1), headers=OTHER))
        await until(lambda: schemas.running("other") == 1)
        assert schemas.waiting("apps") == 7  # on the second worker at once, not behind apps' seven
        gated.gate.set()
        replies = await asyncio.gather(small, *heavy)
    assert [r.status_code for r in replies] == [200] * 9, replies[0].text
    assert schemas.running() == 0 and schemas.waiting() == 0
    assert time.monotonic() - started < BOUND_S
    gated.shutdown()


async def test_a_derive_over_its_budget_is_a_400_naming_the_schemas() -> None:
    executor = ManualExecutor()  # the check never ends: a schema whose check overran every bound
    checks = RequestChecks(CheckPool(1, 1, executor=executor), derive_budget_s=0.01)
    with pytest.raises(InvalidRequest) as raised:
        await checks.derive("a", with_schema(1), lambda: None)
    assert raised.value.code == "invalid_json_schema" and raised.value.param == "response_format"
    assert checks.schemas.running("a") == 1  # its worker stays taken until the thread ends
    executor.finish(None)
    await settle()
    assert checks.schemas.running() == 0


async def test_a_small_body_without_schemas_is_derived_on_the_loop_and_a_large_one_in_the_pool() -> None:
    """The hop to a thread costs more than deriving a small plain body (serve_apps/off_loop/check_pool.py):
    such a body never reaches the pool; a larger one, or any with schemas, still does."""
    plain, schemas = ManualExecutor(), ManualExecutor()
    checks = RequestChecks(CheckPool(1, 1, executor=schemas), CheckPool(1, 1, executor=plain))
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    assert await checks.derive("a", body, lambda: "inline", size=INLINE_DERIVE_BYTES) == "inline"
    assert plain.jobs == [] and schemas.jobs == []
    large = asyncio.create_task(checks.derive("a", body, lambda: "pooled", size=INLINE_DERIVE_BYTES + 1))
    await until(lambda: plain.labels() == ["pooled"])
    plain.finish("pooled")
    assert await large == "pooled"
    schema = asyncio.create_task(checks.derive("a", with_schema(1), lambda: "schema", size=100))
    await until(lambda: schemas.labels() == ["schema"])
    schemas.finish("schema")
    assert await schema == "schema"
