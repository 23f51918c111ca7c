"""Health probes feed the health machines: liveness, latency (SLO), correctness, and black on a refused key."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cluster.config.deployment import parse_config
from router.errors import ConfigError, ProviderRateLimited, ProviderRejected, TargetUnavailable, UpstreamError
from router.resilience.health import Health, HealthBoard, HealthSettings
from router.routing.snapshot import ClusterSnapshot, ReplicaStats
from serve_apps.backend import BackendReply
from serve_apps.resilience.prober import ProbeCheck, Prober, cloud_checks, local_checks
from tests.fakes import FakeClock, FakeEngine, FakeProvider

T0 = 1_800_000_000.0


def config(**golden: Any) -> Any:
    model: dict[str, Any] = {"alias": "m", "source": "prepared:x", "family": "llama", "golden": golden or None}
    return parse_config(
        {
            "models": [model],
            "resilience": {"health": {"liveness_probe_s": 1, "latency_probe_s": 5, "correctness_probe_s": 60}},
        },
        "test",
    )


def board(clock: FakeClock, **settings: Any) -> HealthBoard:
    return HealthBoard(HealthSettings(**settings), clock)


async def test_liveness_follows_fresh_stats_and_three_misses_make_the_model_red() -> None:
    clock = FakeClock(T0)
    stats = ReplicaStats("m", "r1", "n1", T0, 0.1, 0, 0, 0, 0, 364, 128)
    snapshot = ClusterSnapshot(taken_at=T0, replicas=(stats,), max_age_s=1.0)
    health = board(clock)
    checks = local_checks(config().models[0], config(), FakeEngine(), lambda: snapshot, clock)
    assert [c.level for c in checks] == ["liveness", "latency"]  # no golden: no correctness probe
    prober = Prober(checks, health, latency_slo_s=5, timeout_s=5, clock=clock)
    await prober.run_due(clock.now)
    assert prober.results[("local:m", "liveness")] is True
    for _ in range(3):  # the replica stopped pushing stats (stale after max_age_s = 1 s)
        clock.now += 1.5
        await prober.run_due(clock.now)
    assert health.get("local:m").state is Health.RED


async def test_checks_run_on_their_own_periods() -> None:
    clock, calls = FakeClock(T0), []

    async def check() -> bool:
        calls.append(clock.now)
        return True

    prober = Prober(
        [ProbeCheck("cloud:x", "liveness", 10, check)], board(clock), latency_slo_s=1, timeout_s=1, clock=clock
    )
    for _ in range(25):
        await prober.run_due(clock.now)
        clock.now += 1
    assert [t - T0 for t in calls] == [0, 10, 20]


async def test_a_slow_latency_probe_fails_it() -> None:
    clock = FakeClock(T0)

    async def slow() -> bool:
        await asyncio.sleep(0.2)
        return True

    health = board(clock)
    prober = Prober([ProbeCheck("cloud:x", "latency", 1, slow)], health, latency_slo_s=0.01, timeout_s=5, clock=clock)
    await prober.run_due(clock.now)
    assert prober.results[("cloud:x", "latency")] is False
    assert health.get("cloud:x").state is Health.YELLOW


async def test_the_golden_prompt_must_be_answered_right() -> None:
    clock = FakeClock(T0)
    cfg = config(prompt="What is the capital of France?", expect="paris")
    backend = FakeEngine(answer="The capital is Lyon.")
    alive = ClusterSnapshot(T0, (ReplicaStats("m", "r1", "n1", T0, 0.1, 0, 0, 0, 0, 364, 128),), 1.0)
    checks = local_checks(cfg.models[0], cfg, backend, lambda: alive, clock)
    correctness = next(c for c in checks if c.level == "correctness")
    assert await correctness.run() is False
    backend.answer = "PARIS."
    assert await correctness.run() is True
    assert backend.calls[-1][2]["messages"][0]["content"] == "What is the capital of France?"


async def test_a_refused_key_found_by_the_liveness_probe_makes_the_provider_black() -> None:
    clock = FakeClock(T0)
    health = board(clock)
    refused = UpstreamError("cloud provider 'sim' refused our credentials (HTTP 401)", code="provider_auth_failed")
    checks = [c for c in cloud_checks(FakeProvider(probe_error=refused), "m", config()) if c.level == "liveness"]
    await Prober(checks, health, latency_slo_s=1, timeout_s=1, clock=clock).run_due(clock.now)
    assert health.get("cloud:sim").state is Health.BLACK
    assert "provider_auth_failed" in health.get("cloud:sim").reason


async def test_an_unreachable_provider_is_a_failed_probe_not_black() -> None:
    clock = FakeClock(T0)
    health = board(clock)
    down = TargetUnavailable("unreachable", code="provider_unreachable")
    checks = [c for c in cloud_checks(FakeProvider(probe_error=down), "m", config()) if c.level == "liveness"]
    await Prober(checks, health, latency_slo_s=1, timeout_s=1, clock=clock).run_due(clock.now)
    assert health.get("cloud:sim").state is Health.YELLOW


async def test_a_model_not_up_yet_is_no_evidence_and_stays_green() -> None:
    clock = FakeClock(T0)
    health = board(clock)
    backend = FakeEngine()
    empty = ClusterSnapshot(taken_at=T0, replicas=(), max_age_s=1.0)
    checks = local_checks(config().models[0], config(), backend, lambda: empty, clock)
    prober = Prober(checks, health, latency_slo_s=5, timeout_s=5, clock=clock)
    for _ in range(10):  # the replica takes a while to start: no stats at all yet
        await prober.run_due(clock.now)
        clock.now += 5
    assert health.get("local:m").state is Health.GREEN
    assert prober.results[("local:m", "liveness")] is None and backend.calls == []  # no chat sent either


# -- fair probes, per-provider probe chat, a schedule that follows the target ---------------------


class ChatProvider:
    """Answers `probe()` (GET /models) and `chat()` as scripted; records the chat bodies."""

    name = "sim"

    def __init__(self, chat_error: Exception | None = None, models_error: Exception | None = None) -> None:
        self.chat_error = chat_error
        self.models_error = models_error
        self.bodies: list[dict[str, Any]] = []

    async def probe(self) -> None:
        if self.models_error is not None:
            raise self.models_error

    async def chat(self, alias: str, body: dict[str, Any], request_id: str) -> Any:
        self.bodies.append(body)
        if self.chat_error is not None:
            raise self.chat_error
        return BackendReply(body={"choices": [{"message": {"content": "OK"}}]})


def cloud_config(probe: dict[str, Any] | None = None) -> Any:
    provider: dict[str, Any] = {"name": "sim", "base_url": "http://127.0.0.1:1/v1", "models": {"m": "sim-m"}}
    if probe is not None:
        provider["probe"] = probe
    model = {"alias": "m", "source": "prepared:x", "family": "llama"}
    return parse_config({"models": [model], "cloud": {"providers": [provider]}}, "test")


# what provider_openai_compat raises for a content filter's 400 and for a provider without GET /models
CONTENT_FILTER = ProviderRejected(
    "cloud provider 'sim' rejected the request (HTTP 400): The response was filtered due to the prompt "
    "triggering the content management policy.",
    param="prompt",
)
NO_MODELS_ROUTE = ProviderRejected("cloud provider 'sim' rejected the request (HTTP 404): not found", status_code=404)


async def test_a_probe_400_keeps_the_provider_green_and_is_logged(caplog: Any) -> None:
    clock = FakeClock(T0)
    health = board(clock)
    provider = ChatProvider(chat_error=CONTENT_FILTER, models_error=NO_MODELS_ROUTE)
    prober = Prober(cloud_checks(provider, "m", cloud_config()), health, latency_slo_s=5, timeout_s=5, clock=clock)
    for _ in range(10):  # many probe rounds: three failed liveness probes alone would make it red
        await prober.run_due(clock.now)
        clock.advance(10)
    machine = health.get("cloud:sim")
    assert (machine.state, machine.transitions) == (Health.GREEN, [])
    assert machine.evidence.rejections_total == 10 + 4  # 10 liveness rounds, a latency probe every 30 s
    assert (
        machine.evidence.last_rejection is not None and "content management policy" in machine.evidence.last_rejection
    )
    assert prober.results[("cloud:sim", "latency")] is None  # no evidence either way
    assert "rejected as a client error" in caplog.text and "content management policy" in caplog.text


@pytest.mark.parametrize(
    ("error", "state"),
    [
        pytest.param(UpstreamError("refused (HTTP 401)", code="provider_auth_failed"), Health.BLACK, id="401-black"),
        pytest.param(ProviderRateLimited("busy (HTTP 429)"), Health.YELLOW, id="429-failed"),
        pytest.param(
            TargetUnavailable("timed out (HTTP 408)", code="provider_timeout"), Health.YELLOW, id="408-failed"
        ),
        pytest.param(UpstreamError("failed (HTTP 500)", code="provider_error"), Health.YELLOW, id="500-failed"),
        pytest.param(
            ProviderRejected("unknown parameter (HTTP 422)", status_code=422), Health.GREEN, id="422-no-evidence"
        ),
    ],
)
async def test_which_probe_answers_count_against_the_provider(error: Exception, state: Health) -> None:
    clock = FakeClock(T0)
    health = board(clock)
    checks = [c for c in cloud_checks(ChatProvider(chat_error=error), "m", cloud_config()) if c.level == "latency"]
    await Prober(checks, health, latency_slo_s=5, timeout_s=5, clock=clock).run_due(clock.now)
    assert health.get("cloud:sim").state is state


async def test_the_probe_chat_is_the_providers_own() -> None:
    default, custom = ChatProvider(), ChatProvider()
    for provider, config in (
        (default, cloud_config()),
        (custom, cloud_config({"prompt": "ping", "max_tokens": 4, "temperature": 1})),
    ):
        (latency,) = [c for c in cloud_checks(provider, "m", config) if c.level == "latency"]
        assert await latency.run() is True
    # defaults any capable model accepts: no temperature, room for a short answer
    assert default.bodies == [
        {"model": "m", "messages": [{"role": "user", "content": "Reply with the word OK."}], "max_tokens": 16}
    ]
    assert custom.bodies == [
        {"model": "m", "messages": [{"role": "user", "content": "ping"}], "max_tokens": 4, "temperature": 1}
    ]
    nothing = ChatProvider()
    (latency,) = [c for c in cloud_checks(nothing, "m", cloud_config({"max_tokens": None})) if c.level == "latency"]
    await latency.run()
    assert "max_tokens" not in nothing.bodies[0]


@pytest.mark.parametrize(
    "probe",
    [
        {"prompt": ""},
        {"prompt": "x" * 2001},
        {"max_tokens": 0},
        {"max_tokens": 10_000},
        {"temperature": -1},
        {"temperature": "hot"},
        {"prompt": "hi", "extra_body": {"n": 100}},  # unknown keys are errors, nothing is passed through
    ],
)
def test_hostile_probe_settings_are_config_errors(probe: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=r"cloud\.providers\[0\]\.probe"):
        cloud_config(probe)


async def test_probes_follow_the_targets_transitions_not_the_start_up() -> None:
    clock, calls = FakeClock(T0), []

    async def check() -> bool:
        calls.append(clock.now - T0)
        return True

    health = board(clock)
    prober = Prober(
        [ProbeCheck("cloud:x", "liveness", 10, check)],
        health,
        latency_slo_s=1,
        timeout_s=1,
        recovery_probe_s=5,
        clock=clock,
    )
    for step in range(90):
        if step == 26:  # t=13, between two probes: five requests fail in a row, red at once
            for _ in range(5):
                health.get("cloud:x").outcome(False)
        await prober.run_due(clock.now)
        clock.advance(0.5)
    # green: every 10 s from start-up; red at 13: every 5 s from the transition (18, 23); the probe at
    # 18 is outranked by the live failures, the one at 23 counts, half-open at 23 (cool-down), the
    # second good probe at 28 starts the ramp; ramping (yellow): every 10 s from the ramp's start
    assert calls == [0, 10, 18, 23, 28, 38]
    assert [(t.at - T0, t.to_state.value) for t in health.get("cloud:x").transitions][-2:] == [
        (28, "yellow"),
        (38, "yellow"),
    ]


async def test_probes_alone_bring_a_recovered_provider_back_within_30s_on_the_defaults() -> None:
    """No live traffic: a provider down for 60 s, then healthy; real Prober, default settings."""
    clock = FakeClock(T0)
    health = HealthBoard(HealthSettings(), clock)
    down = TargetUnavailable("unreachable", code="provider_unreachable")
    provider = ChatProvider()
    defaults = cloud_config().resilience.health
    prober = Prober(
        cloud_checks(provider, "m", cloud_config()),
        health,
        latency_slo_s=defaults.latency_slo_s,
        timeout_s=defaults.probe_timeout_s,
        recovery_probe_s=defaults.recovery_probe_s,
        clock=clock,
    )
    for step in range(240):  # 120 s in 0.5 s ticks; down from 17 s to 77 s (not on a probe boundary)
        t = step * 0.5
        provider.models_error = provider.chat_error = down if 17 <= t < 77 else None
        clock.now = T0 + t
        await prober.run_due(clock.now)
    log = [(t.at - T0, t.to_state.value, t.share) for t in health.get("cloud:sim").transitions]
    assert any(state == "red" for _, state, _ in log), log
    ramp_start = min(at for at, state, _ in log if at >= 77 and state != "red")
    assert ramp_start - 77 <= 30, log
    assert health.get("cloud:sim").state is Health.GREEN  # ramp complete 30 s after it started


@pytest.mark.parametrize(
    ("health", "field"),
    [
        ({"half_open_share": 1.5}, "half_open_share"),
        ({"half_open_share": "most"}, "half_open_share"),
        ({"red_live_failures": 0}, "red_live_failures"),
        ({"recovery_probe_s": 0}, "recovery_probe_s"),
        ({"live_evidence_s": -1}, "live_evidence_s"),
        ({"recovery_probes": 0}, "recovery_probes"),
        ({"probe_everything": True}, "probe_everything"),
    ],
)
def test_hostile_health_settings_are_config_errors(health: dict[str, Any], field: str) -> None:
    model = {"alias": "m", "source": "prepared:x", "family": "llama"}
    with pytest.raises(ConfigError, match=rf"resilience\.health\.{field}"):
        parse_config({"models": [model], "resilience": {"health": health}}, "test")
