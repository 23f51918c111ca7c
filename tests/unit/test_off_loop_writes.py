"""SQLite spend ledger and decision-log writes leave the event loop; ledger and decision-log
failures show in /metrics.

Real parts: a real SQLite file locked by a second connection (what another gateway process
inside its transaction looks like), a real FIFO as the decision log (an `open()` that blocks
until a reader comes, like a stalled disk), the real metrics page.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from pathlib import Path

import httpx

from cluster.config.deployment import parse_config
from router.learning.decision import DecisionRecord, DecisionStore
from serve_apps.dispatch.interfaces import LocalDispatch
from serve_apps.gateway_parts import GatewayParts
from serve_apps.http.surface import GatewayHTTP
from serve_apps.learning.decision_log import JsonlFile
from serve_apps.limits.spend_ledger import SpendLedger
from serve_apps.off_loop.background_writer import BackgroundWriter
from serve_apps.resilience.state import Resilience
from serve_apps.telemetry.metrics import GatewayMetrics
from tests.fakes import FakeEngine
from tests.unit.test_gateway_http import MODELS

CONFIG = {"models": [{"alias": "m", "source": "prepared:x", "family": "llama"}]}


def _rows(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM spend").fetchone()[0])


async def test_spend_ledger_writes_leave_the_event_loop(tmp_path: Path) -> None:
    path = tmp_path / "spend.sqlite"
    ledger = SpendLedger(path, clock=lambda: 1_800_000_000.0, background=True)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")  # another process holds the database (inserts wait on it)
    ledger.add("r1", "cloud:sim/m", "sim", "ok", 0.25)  # returns at once: queued for the writer thread
    ticks = 0
    for _ in range(10):  # the event loop keeps running while the write waits on the lock
        await asyncio.sleep(0)
        ticks += 1
    assert ticks == 10 and ledger.write_failures == 0
    other.execute("COMMIT")
    other.close()
    assert await asyncio.to_thread(ledger.flush, 30.0)
    assert _rows(path) == 1 and ledger.month_total(1_800_000_000.0) == 0.25
    ledger.close()


async def test_month_total_is_read_by_the_writer_thread(tmp_path: Path) -> None:
    ledger = SpendLedger(tmp_path / "s.sqlite", clock=lambda: 1_800_000_000.0, background=True, month_refresh_s=0)
    ledger.add("r1", "cloud:sim/m", "sim", "ok", 1.5)
    assert ledger.recent_month_total() == 0.0  # nothing read yet: the caller never waits on SQLite
    assert await asyncio.to_thread(ledger.flush, 30.0)
    assert ledger.recent_month_total() == 1.5
    ledger.close()


async def test_decision_log_writes_leave_the_event_loop(tmp_path: Path) -> None:
    fifo = tmp_path / "decisions.jsonl"
    os.mkfifo(fifo)  # appending blocks in open() until a reader comes: a stalled disk
    writer = BackgroundWriter(JsonlFile(str(fifo)), name="decision-log")
    store = DecisionStore(sink=writer)
    store.put(DecisionRecord("r1", "v1", {}, (), (), started_at=0.0))  # returns: the thread waits, not us
    assert store.get("r1") is not None and store.sink_failures == 0
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(fifo.open().read().splitlines()))
    reader.start()
    assert await asyncio.to_thread(writer.flush, 30.0)
    await asyncio.to_thread(reader.join, 30.0)
    assert [DecisionRecord.from_json(line).request_id for line in lines] == ["r1"]
    writer.close()


def test_background_writer_counts_failures_and_drops() -> None:
    def fail(item: int) -> None:
        raise OSError("disk full")

    writer: BackgroundWriter[int] = BackgroundWriter(fail, name="t", max_queued=1)
    writer.submit(1)
    assert writer.flush(30.0) and writer.failures == 1
    writer.close()
    assert writer.submit(2) is False and writer.dropped == 1


async def test_ledger_failures_show_in_metrics(tmp_path: Path) -> None:
    ledger = SpendLedger(tmp_path / "spend.sqlite", clock=lambda: 1_800_000_000.0, background=True)
    ledger.close()  # the file went away under the gateway: every later write fails
    ledger.add("r1", "cloud:sim/m", "sim", "ok", 0.1)
    res = Resilience(parse_config(CONFIG, "test"), spend=ledger)
    metrics = GatewayMetrics()
    metrics.resilience(res.view())  # what the gateway does on every telemetry refresh
    engine = FakeEngine()
    gateway = GatewayHTTP(engine, MODELS, LocalDispatch(engine), created=1, parts=GatewayParts(metrics=metrics))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app), base_url="http://gw") as client:
        page = (await client.get("/metrics")).text
    assert 'spillover_spend_ledger_failures_total{op="write"} 1.0' in page
    assert 'spillover_spend_ledger_failures_total{op="read"} 0.0' in page
    metrics.resilience(res.view())  # counted once, not again on the next refresh
    assert 'spillover_spend_ledger_failures_total{op="write"} 1.0' in metrics.render().decode()


async def test_decision_log_failures_show_in_metrics(tmp_path: Path) -> None:
    """A decision log that cannot be written (its folder is a file: every open() fails) loses
    lines; the gateway counts them on /metrics instead of failing requests."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    writer: BackgroundWriter[str] = BackgroundWriter(JsonlFile(str(blocker / "decisions.jsonl")), name="decision-log")
    writer.submit('{"request_id": "r1"}')
    assert writer.flush(30.0) and writer.failures == 1
    writer.close()
    writer.submit('{"request_id": "r2"}')  # after close: dropped
    metrics = GatewayMetrics()
    metrics.decision_log(failed=writer.failures, dropped=writer.dropped)  # what each telemetry refresh does
    metrics.decision_log(failed=writer.failures, dropped=writer.dropped)  # counted once
    page = metrics.render().decode()
    assert 'spillover_decision_log_failures_total{reason="write"} 1.0' in page
    assert 'spillover_decision_log_failures_total{reason="dropped"} 1.0' in page


async def test_a_failed_read_keeps_the_months_last_good_totals(tmp_path: Path) -> None:
    """A read that fails (here the table renamed away under the gateway by another connection: SQLite's real
    `no such table`) must not read as "nothing spent": tenant budgets would stop being enforced."""
    path = tmp_path / "spend.sqlite"
    ledger = SpendLedger(path, clock=lambda: 1_800_000_000.0, background=True, month_refresh_s=0)
    ledger.add("r1", "cloud:sim/m", "sim", "ok", 2.0, tenant="t1")

    async def reading() -> dict[str, float]:
        # First let the writer finish what is queued: a refresh asked by the previous reading's last call may
        # still wait in the queue, and while one is pending no other is asked, so that older refresh (queued
        # before the rows added since) would be the reading returned.
        assert await asyncio.to_thread(ledger.flush, 30.0)
        ledger.recent_tenant_totals()  # asks the writer thread for a fresh reading, after every row so far
        assert await asyncio.to_thread(ledger.flush, 30.0)
        return ledger.recent_tenant_totals()

    assert await reading() == {"t1": 2.0}
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("ALTER TABLE spend RENAME TO spend_aside")
    assert await reading() == {"t1": 2.0} and ledger.read_failures > 0
    assert ledger.recent_month_total() == 2.0
    other.execute("ALTER TABLE spend_aside RENAME TO spend")
    other.close()
    ledger.add("r2", "cloud:sim/m", "sim", "ok", 1.0, tenant="t1")
    assert await reading() == {"t1": 3.0}
    ledger.close()
