"""Provider RPM/TPM sliding windows: admission, refusal reasons, retry_in, settle; fake clock."""

from __future__ import annotations

import pytest

from router.limits.quota import ProviderQuota, Quotas, Refusal, Reservation
from tests.fakes import FakeClock as Clock


def quota(clock: Clock, *, rpm: int | None = None, tpm: int | None = None) -> ProviderQuota:
    return ProviderQuota(rpm=rpm, tpm=tpm, clock=clock, name="sim")


def test_rpm_admits_up_to_the_limit_then_refuses_with_reason_and_retry() -> None:
    clock = Clock()
    q = quota(clock, rpm=3)
    for i in range(3):
        assert isinstance(q.try_reserve(10), Reservation)
        clock.now += 5 * (i + 1)  # entries at 1000, 1005, 1015; now 1030
    refusal = q.try_reserve(10)
    assert isinstance(refusal, Refusal)
    assert refusal.reason == "sim: 3/3 requests in the last 60s"
    assert refusal.provider == "sim"
    assert refusal.retry_in_s == pytest.approx(30.0)  # the entry at 1000 leaves at 1060
    assert q.usage() == (3, 30)  # a refusal records nothing


def test_rpm_window_slides() -> None:
    clock = Clock()
    q = quota(clock, rpm=1)
    assert isinstance(q.try_reserve(1), Reservation)
    clock.now += 59.9
    assert isinstance(q.try_reserve(1), Refusal)
    clock.now += 0.1  # exactly 60 s later: the first entry left the window
    assert isinstance(q.try_reserve(1), Reservation)
    assert q.usage() == (1, 1)


def test_tpm_refuses_when_tokens_do_not_fit_and_retry_waits_for_enough_to_leave() -> None:
    clock = Clock()
    q = quota(clock, tpm=1000)
    assert isinstance(q.try_reserve(400), Reservation)  # at 1000
    clock.now = 1010
    assert isinstance(q.try_reserve(300), Reservation)  # at 1010
    clock.now = 1020
    assert isinstance(q.try_reserve(200), Reservation)  # at 1020; 900 in the window
    refusal = q.try_reserve(600)  # needs 500 freed: the first two entries (400 + 300)
    assert isinstance(refusal, Refusal)
    assert refusal.reason == "sim: 900/1000 tokens in the last 60s, request needs 600"
    assert refusal.retry_in_s == pytest.approx(50.0)  # the entry at 1010 leaves at 1070
    small = q.try_reserve(100)  # exactly fits
    assert isinstance(small, Reservation)
    assert q.usage() == (4, 1000)


def test_request_larger_than_tpm_is_refused_without_retry() -> None:
    q = quota(Clock(), tpm=1000)
    refusal = q.try_reserve(1001)
    assert isinstance(refusal, Refusal)
    assert refusal.retry_in_s is None
    assert "1001 tokens" in refusal.reason and "1000 tokens per 60s" in refusal.reason
    assert q.usage() == (0, 0)


def test_both_limits_report_both_reasons_and_the_longer_wait() -> None:
    clock = Clock()
    q = quota(clock, rpm=2, tpm=100)
    q.try_reserve(10)  # at 1000
    clock.now = 1030
    q.try_reserve(90)  # at 1030
    clock.now = 1040
    refusal = q.try_reserve(50)
    assert isinstance(refusal, Refusal)
    assert "2/2 requests" in refusal.reason and "100/100 tokens" in refusal.reason
    # rpm frees a slot at 1060, but 50 tokens are free only once the entry at 1030 left: 1090.
    assert refusal.retry_in_s == pytest.approx(50.0)
    clock.now = 1060
    assert isinstance(q.try_reserve(50), Refusal)
    clock.now = 1090
    assert isinstance(q.try_reserve(50), Reservation)


def test_settle_replaces_the_estimate_with_actual_usage() -> None:
    clock = Clock()
    q = quota(clock, tpm=1000)
    r = q.try_reserve(900)  # prompt estimate + max_tokens
    assert isinstance(r, Reservation)
    assert isinstance(q.try_reserve(200), Refusal)
    q.settle(r, 150)  # the provider reported 150 tokens
    assert q.usage() == (1, 150)
    assert isinstance(q.try_reserve(800), Reservation)
    assert q.usage() == (2, 950)


def test_settle_after_the_entry_left_the_window_changes_nothing() -> None:
    clock = Clock()
    q = quota(clock, tpm=1000)
    r = q.try_reserve(100)
    assert isinstance(r, Reservation)
    clock.now += 61
    q.try_reserve(50)
    q.settle(r, 999)
    assert q.usage() == (1, 50)


def test_unlimited_quota_admits_everything_but_counts_usage() -> None:
    q = quota(Clock())
    for _ in range(500):
        assert isinstance(q.try_reserve(10_000), Reservation)
    assert q.usage() == (500, 5_000_000)


@pytest.mark.parametrize("kwargs", [{"rpm": 0, "tpm": None}, {"rpm": None, "tpm": -1}])
def test_invalid_limits_are_rejected(kwargs: dict[str, int | None]) -> None:
    with pytest.raises(ValueError):
        ProviderQuota(clock=Clock(), **kwargs)


def test_negative_tokens_are_a_programming_error() -> None:
    with pytest.raises(ValueError):
        quota(Clock()).try_reserve(-1)


def test_quotas_keep_one_window_per_provider() -> None:
    clock = Clock()
    quotas = Quotas({"sim": (1, None), "openai": (None, 100)}, clock=clock)
    assert "sim" in quotas and "other" not in quotas
    r = quotas.try_reserve("sim", 10)
    assert isinstance(r, Reservation) and r.provider == "sim"
    refused = quotas.try_reserve("sim", 10)
    assert isinstance(refused, Refusal) and refused.reason.startswith("sim: 1/1 requests")
    # The other provider's window is independent.
    o = quotas.try_reserve("openai", 80)
    assert isinstance(o, Reservation)
    quotas.settle(o, 20)
    assert quotas.usage() == {"sim": (1, 10), "openai": (1, 20)}


def test_quotas_unknown_provider_is_unlimited_and_shows_in_usage() -> None:
    quotas = Quotas({}, clock=Clock())
    for _ in range(3):
        assert isinstance(quotas.try_reserve("new", 5), Reservation)
    assert quotas.usage() == {"new": (3, 15)}
