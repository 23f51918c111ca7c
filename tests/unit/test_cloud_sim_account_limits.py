"""cloud-sim's account limits (bench/cloud_sim/provider/account_limits.py): OpenAI's x-ratelimit-* headers on every
answer, a 429 with Retry-After past the limit (not counted), a window that frees its oldest admission after 60 s, and
the gateway's own parser reading what the sim sends."""

from __future__ import annotations

import random

from bench.cloud_sim import SimSettings, build_app
from router.limits.rate_headers import read_rate_limits
from tests.unit.cloud_sim_client import RecordingSleep, chat, client_for


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def sim(clock: Clock, **limits: int):  # type: ignore[no-untyped-def]
    settings = SimSettings(models=("sim-a",), ttft_s=0.0, tokens_per_s=0.0, **limits)
    return build_app(settings, rng=random.Random(1), clock=clock, sleep=RecordingSleep()).state.cloud_sim


async def test_requests_a_minute_are_reported_then_refused_until_the_window_frees() -> None:
    clock = Clock()
    cloud = sim(clock, rpm_limit=2)
    async with client_for(cloud) as client:
        first = await client.post("/v1/chat/completions", json=chat(max_tokens=4))
        clock.now += 10
        second = await client.post("/v1/chat/completions", json=chat(max_tokens=4))
        third = await client.post("/v1/chat/completions", json=chat(max_tokens=4))
        clock.now += 50.5  # the first admission leaves the window
        fourth = await client.post("/v1/chat/completions", json=chat(max_tokens=4))
    assert [r.status_code for r in (first, second, third, fourth)] == [200, 200, 429, 200]
    assert first.headers["x-ratelimit-limit-requests"] == "2"
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    assert second.headers["x-ratelimit-remaining-requests"] == "0"
    assert second.headers["x-ratelimit-reset-requests"] == "50s"  # until the first admission leaves the window
    assert third.json()["error"]["code"] == "rate_limit_exceeded" and third.headers["retry-after"] == "50"
    assert fourth.headers["x-ratelimit-remaining-requests"] == "0"
    reading = read_rate_limits(second.headers, wall_now=clock.now, max_reset_s=60)
    assert reading is not None and reading.requests is not None
    assert (reading.requests.count, reading.requests.reset_s) == (0, 50)


async def test_tokens_a_minute_count_the_prompt_and_max_tokens() -> None:
    clock = Clock()
    cloud = sim(clock, tpm_limit=30)
    async with client_for(cloud) as client:
        one = await client.post("/v1/chat/completions", json=chat(max_tokens=10))  # 6 words + 10
        two = await client.post("/v1/chat/completions", json=chat(max_tokens=10))
    assert (one.status_code, one.headers["x-ratelimit-remaining-tokens"]) == (200, "14")
    assert two.status_code == 429 and two.headers["x-ratelimit-remaining-tokens"] == "14"
    assert "x-ratelimit-limit-requests" not in one.headers  # only the limits that are set


async def test_no_limits_no_headers_and_a_reset_forgets_the_window() -> None:
    clock = Clock()
    cloud = sim(clock)
    async with client_for(cloud) as client:
        plain = await client.post("/v1/chat/completions", json=chat())
        await client.post("/control/faults", json={"rpm_limit": 1})
        assert (await client.post("/v1/chat/completions", json=chat())).status_code == 200
        assert (await client.post("/v1/chat/completions", json=chat())).status_code == 429
        await client.post("/control/reset")
        await client.post("/control/faults", json={"rpm_limit": 1})
        again = await client.post("/v1/chat/completions", json=chat())
    assert not any(k.startswith("x-ratelimit") for k in plain.headers)
    assert again.status_code == 200
