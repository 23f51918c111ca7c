"""Spend ledger persistence (SQLite in tmp_path), month boundaries, soft budget, hard cap."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest

from router.errors import ConfigError
from router.limits.budget import cost_weight
from serve_apps.limits.spend_ledger import SpendLedger, month_bounds
from tests.fakes import FakeClock as Clock
from tests.ledger_rows import spend_by_provider


def ts(*args: int) -> float:
    return datetime(*args, tzinfo=UTC).timestamp()


def test_totals_survive_close_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "state" / "nested" / "spend.db"  # parent folders are created
    clock = Clock(ts(2025, 3, 10))
    ledger = SpendLedger(path, clock=clock)
    ledger.add("req-1", "cloud:sim/small", "sim", "ok", 0.25)
    ledger.add("req-2", "cloud:sim/small", "sim", "timeout", 0.5)  # failed attempts count too
    ledger.add("req-2", "cloud:openai/gpt", "openai", "ok", 1.0)
    ledger.close()
    ledger.close()  # idempotent

    reopened = SpendLedger(path, clock=clock)
    assert reopened.month_total() == pytest.approx(1.75)
    assert spend_by_provider(reopened, since=0) == pytest.approx({"sim": 0.75, "openai": 1.0})
    reopened.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        outcomes = [r[0] for r in conn.execute("SELECT outcome FROM spend ORDER BY id")]
    assert outcomes == ["ok", "timeout", "ok"]


def test_month_total_counts_only_the_utc_calendar_month(tmp_path: Path) -> None:
    clock = Clock(ts(2025, 1, 31, 23, 59, 59))
    ledger = SpendLedger(tmp_path / "spend.db", clock=clock)
    ledger.add("a", "t", "sim", "ok", 1.0)  # last second of January
    clock.now = ts(2025, 2, 1)
    ledger.add("b", "t", "sim", "ok", 2.0)  # first second of February
    clock.now = ts(2025, 2, 28, 12)
    ledger.add("c", "t", "sim", "ok", 4.0)
    clock.now = ts(2025, 3, 1)
    ledger.add("d", "t", "sim", "ok", 8.0)

    assert ledger.month_total(ts(2025, 1, 15)) == pytest.approx(1.0)
    assert ledger.month_total(ts(2025, 2, 15)) == pytest.approx(6.0)
    assert ledger.month_total() == pytest.approx(8.0)  # the clock's month: March
    assert ledger.month_total(ts(2025, 4, 1)) == 0.0
    assert spend_by_provider(ledger, since=ts(2025, 2, 28)) == pytest.approx({"sim": 12.0})
    ledger.close()


@pytest.mark.parametrize(
    ("now", "start", "end"),
    [
        (ts(2025, 6, 15, 8), ts(2025, 6, 1), ts(2025, 7, 1)),
        (ts(2024, 12, 31, 23, 59), ts(2024, 12, 1), ts(2025, 1, 1)),  # year rollover
        (ts(2024, 2, 29), ts(2024, 2, 1), ts(2024, 3, 1)),  # leap day
    ],
)
def test_month_bounds(now: float, start: float, end: float) -> None:
    assert month_bounds(now) == (start, end)


def test_two_ledgers_on_the_same_file_see_each_others_writes(tmp_path: Path) -> None:
    path = tmp_path / "spend.db"
    clock = Clock(ts(2025, 5, 5))
    a = SpendLedger(path, clock=clock)
    b = SpendLedger(path, clock=clock)
    a.add("r1", "t", "sim", "ok", 0.1)
    b.add("r2", "t", "openai", "ok", 0.2)
    a.add("r3", "t", "sim", "error", 0.3)
    assert a.month_total() == pytest.approx(0.6)
    assert b.month_total() == pytest.approx(0.6)
    assert spend_by_provider(b, since=0) == pytest.approx({"sim": 0.4, "openai": 0.2})
    assert a.write_failures == b.write_failures == 0
    a.close()
    b.close()


def test_memory_ledger_works() -> None:
    ledger = SpendLedger(":memory:", clock=Clock(ts(2025, 1, 2)))
    ledger.add("r", "t", "sim", "ok", 0.5)
    assert ledger.month_total() == pytest.approx(0.5)
    ledger.close()


def test_unusable_path_is_a_config_error_naming_the_path(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    bad = blocker / "sub" / "spend.db"  # a file stands where a folder must be (fails as root too)
    with pytest.raises(ConfigError) as e:
        SpendLedger(bad, clock=Clock(0.0))
    assert e.value.path == str(bad)
    assert str(bad) in e.value.message
    assert "cannot open" in e.value.message


def test_path_that_is_a_directory_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        SpendLedger(tmp_path, clock=Clock(0.0))
    assert e.value.path == str(tmp_path)


def test_write_failure_is_counted_and_swallowed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ledger = SpendLedger(tmp_path / "spend.db", clock=Clock(ts(2025, 1, 2)))
    ledger.close()
    ledger.add("req-9", "cloud:sim/x", "sim", "ok", 0.1)  # must not raise
    assert ledger.write_failures == 1
    assert "req-9" in caplog.text
    assert ledger.month_total() == 0.0  # reads degrade too, counted
    assert ledger.read_failures == 1


@pytest.mark.parametrize(
    ("spent", "budget", "expected"),
    [
        (0.0, 100.0, 1.0),
        (50.0, 100.0, 1.0),  # up to 50 %: base weight
        (75.0, 100.0, 2.5),  # halfway up the ramp: 1 + 3 × 0.5
        (100.0, 100.0, 4.0),  # at the budget: base × max_factor
        (250.0, 100.0, 4.0),  # beyond: stays (soft, never a refusal)
        (1e9, None, 1.0),  # no budget
        (10.0, 0.0, 1.0),  # zero budget means none
    ],
)
def test_cost_weight_table(spent: float, budget: float | None, expected: float) -> None:
    assert cost_weight(spent, budget, base_weight=1.0) == pytest.approx(expected)


def test_cost_weight_scales_base_and_max_factor() -> None:
    assert cost_weight(90.0, 100.0, base_weight=0.5, max_factor=2.0) == pytest.approx(0.5 * 1.8)
    assert cost_weight(200.0, 100.0, base_weight=0.5, max_factor=2.0) == pytest.approx(1.0)
