"""Provider rate-limit headers feed the RPM/TPM windows: parsing (hostile values included), the
quota honouring what the provider said until its reset, and the gateway's Resilience reading the
headers a provider adapter hands it. Fake clocks throughout: no timing assertion.

The header names and formats are the providers' documented ones: OpenAI-compatible
`x-ratelimit-remaining-requests` / `-tokens` with `x-ratelimit-reset-*` durations ("6m0s", "20ms"),
and Anthropic's `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-remaining` with
RFC 3339 `-reset` times."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from cluster.config.deployment import dump_config, load_config, parse_config
from router.limits.quota import ProviderQuota, Refusal, Reservation
from router.limits.rate_headers import RateLimitReading, Remaining, parse_count, parse_reset, read_rate_limits
from router.routing.capabilities import cloud_target
from serve_apps.resilience.state import Resilience
from tests.fakes import FakeClock as Clock

REPO = Path(__file__).resolve().parents[2]
WALL = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC).timestamp()


def rfc3339(seconds_from_wall: float) -> str:
    return datetime.fromtimestamp(WALL + seconds_from_wall, UTC).isoformat().replace("+00:00", "Z")


def test_openai_headers() -> None:
    headers = {
        "x-ratelimit-remaining-requests": "4999",
        "x-ratelimit-reset-requests": "12ms",
        "x-ratelimit-remaining-tokens": "159976",
        "x-ratelimit-reset-tokens": "6m0s",
    }
    reading = read_rate_limits(headers, wall_now=WALL, max_reset_s=600)
    assert reading == RateLimitReading(Remaining(4999, pytest.approx(0.012)), Remaining(159976, 360.0))


def test_anthropic_headers_keep_the_smallest_token_axis() -> None:
    headers = {
        "anthropic-ratelimit-requests-remaining": "999",
        "anthropic-ratelimit-requests-reset": rfc3339(1),
        "anthropic-ratelimit-tokens-remaining": "96000",
        "anthropic-ratelimit-tokens-reset": rfc3339(2),
        "anthropic-ratelimit-input-tokens-remaining": "80000",
        "anthropic-ratelimit-input-tokens-reset": rfc3339(3),
        "anthropic-ratelimit-output-tokens-remaining": "16000",
        "anthropic-ratelimit-output-tokens-reset": rfc3339(4),
    }
    reading = read_rate_limits(headers, wall_now=WALL, max_reset_s=600)
    assert reading == RateLimitReading(Remaining(999, 1.0), Remaining(16000, 4.0))


def test_no_rate_limit_headers_is_no_reading() -> None:
    assert read_rate_limits({"content-type": "application/json"}, wall_now=WALL, max_reset_s=60) is None


@pytest.mark.parametrize(
    "raw",
    ["-1", "1.5", "1e9", "0x10", "9" * 16, "", " ", "NaN", "١٢", "12 34", "+5"],
)
def test_hostile_counts_are_ignored(raw: str) -> None:
    assert parse_count(raw) is None
    assert read_rate_limits({"x-ratelimit-remaining-requests": raw}, wall_now=WALL, max_reset_s=60) is None


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("1s", 1.0),
        ("6m0s", 360.0),
        ("1h2m3.5s", 3723.5),
        ("20ms", 0.02),
        ("1.5", 1.5),
        ("inf", None),
        ("nan", None),
        ("-3", None),
        ("3 s", None),
        ("s", None),
        ("1d", None),
        ("1" * 100, None),
        ("2026-13-01T00:00:00Z", None),
        ("2026-11-30T12:00:00", None),  # no zone: cannot be placed in time
    ],
)
def test_reset_values(raw: str, expected: float | None) -> None:
    assert parse_reset(raw, wall_now=WALL) == (pytest.approx(expected) if expected is not None else None)


def test_resets_are_clamped_to_the_cap_and_never_negative() -> None:
    far = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "999999h"}
    past = {"anthropic-ratelimit-requests-remaining": "0", "anthropic-ratelimit-requests-reset": rfc3339(-30)}
    year = {"anthropic-ratelimit-requests-remaining": "0", "anthropic-ratelimit-requests-reset": "9999-12-31T23:59:59Z"}
    assert read_rate_limits(far, wall_now=WALL, max_reset_s=60).requests == Remaining(0, 60.0)  # type: ignore[union-attr]
    assert read_rate_limits(past, wall_now=WALL, max_reset_s=60).requests == Remaining(0, 0.0)  # type: ignore[union-attr]
    assert read_rate_limits(year, wall_now=WALL, max_reset_s=60).requests == Remaining(0, 60.0)  # type: ignore[union-attr]


def test_the_quota_refuses_what_the_provider_says_is_gone_until_its_reset() -> None:
    clock = Clock()
    q = ProviderQuota(rpm=None, tpm=None, clock=clock, name="anth")
    q.observe(RateLimitReading(Remaining(2, 10.0), None))
    assert isinstance(q.try_reserve(5), Reservation)
    assert isinstance(q.try_reserve(5), Reservation)
    refusal = q.try_reserve(5)
    assert isinstance(refusal, Refusal)
    assert "provider reports no requests left" in refusal.reason and refusal.retry_in_s == pytest.approx(10.0)
    clock.now += 4
    assert q.try_reserve(5).retry_in_s == pytest.approx(6.0)  # type: ignore[union-attr]
    assert q.reported() == {"requests": {"left": 0, "reset_in_s": 6.0}}
    clock.now += 6  # the provider's reset: its word no longer binds
    assert isinstance(q.try_reserve(5), Reservation) and q.reported() == {}


def test_reported_tokens_bound_the_request_estimate_and_a_newer_reading_replaces_it() -> None:
    clock = Clock()
    q = ProviderQuota(rpm=None, tpm=None, clock=clock, name="oa")
    q.observe(RateLimitReading(None, Remaining(1000, 30.0)))
    assert isinstance(q.try_reserve(600), Reservation)
    refusal = q.try_reserve(600)  # 400 left
    assert isinstance(refusal, Refusal) and "400 tokens left" in refusal.reason
    q.observe(RateLimitReading(None, Remaining(5000, 30.0)))
    assert isinstance(q.try_reserve(600), Reservation)


def test_a_reading_without_a_reset_holds_for_one_window() -> None:
    clock = Clock()
    q = ProviderQuota(rpm=None, tpm=None, clock=clock, name="oa", window_s=60)
    q.observe(RateLimitReading(Remaining(0, None), None))
    assert q.try_reserve(1).retry_in_s == pytest.approx(60.0)  # type: ignore[union-attr]
    clock.now += 60
    assert isinstance(q.try_reserve(1), Reservation)


def test_local_limits_still_apply_next_to_the_providers_word() -> None:
    clock = Clock()
    q = ProviderQuota(rpm=1, tpm=None, clock=clock, name="oa")
    q.observe(RateLimitReading(Remaining(100, 5.0), None))
    assert isinstance(q.try_reserve(1), Reservation)
    assert "1/1 requests" in q.try_reserve(1).reason  # type: ignore[union-attr]


async def test_resilience_applies_a_providers_headers_to_its_gate() -> None:
    clock, wall = Clock(), Clock(WALL)
    raw = dump_config(load_config(REPO / "configs/local.yaml"))
    raw["resilience"] = {"retry": {"max_retry_after_s": 30}}
    config = parse_config(raw, "configs/local.yaml, max_retry_after_s 30")
    res = Resilience(config, clock=clock, wall=wall)
    (provider,) = config.cloud.providers
    target = cloud_target(provider.name, "smollm2-135m-instruct", provider.models["smollm2-135m-instruct"])
    headers = {"anthropic-ratelimit-requests-remaining": "0", "anthropic-ratelimit-requests-reset": rfc3339(3600)}
    res.observe_rate_limits(provider.name, headers)
    gate = await res.gate(target, has_alternative=True, tokens=10)
    assert gate.refused is not None and "no requests left for 30.0s" in gate.refused  # capped at max_retry_after_s
    assert res.view()["provider_reported"] == {provider.name: {"requests": {"left": 0, "reset_in_s": 30.0}}}
    res.observe_rate_limits(provider.name, {"x-ratelimit-remaining-requests": "junk"})  # ignored, never raises
    clock.now += 30
    assert (await res.gate(target, has_alternative=True, tokens=10)).refused is None
