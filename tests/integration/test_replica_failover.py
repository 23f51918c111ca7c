"""The local model's replica dies under load.

Non-streamed requests keep arriving from two clients. When the replica is killed (ray.kill), its
stats go stale after `telemetry.max_age_s` and requests burst to the cloud at once: none may fail;
its health turns red once the staleness lasted `stale_red_s` (30 s). Serve starts a new replica;
once its stats are fresh again and the cool-down is over, a half-open trial request that succeeds (or
`recovery_probes` good liveness probes) starts the ramp of the local share 20% → 50% → 100%
(`ramp_step_s` each) and local traffic comes back. local_only requests never leave.

The test leaves the stack as it found it, whatever the order the tests run in: one fresh replica of
the model on the telemetry board (the killed one's last reading is forgotten after the board's
`forget_after_s`, 60 s) and the gateway's resilience state reset.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
import ray

from tests.integration.conftest import Stack
from tests.integration.qwen_load import QWEN, SHORT, chat, chat_until_local, cloud_requests, qwen_replicas

pytestmark = pytest.mark.integration


def _replica_actor() -> tuple[str, str]:
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if f"SpilloverLLMServer:{QWEN}" in actor["name"] or f"LLMServer:{QWEN}" in actor["name"]:
            return actor["name"], actor["namespace"]
    raise AssertionError("no replica actor found for the qwen deployment")


@dataclass(frozen=True)
class Sent:
    at: float
    status: int
    route: str
    reason: str


class Load:
    """Two clients sending short non-streamed requests back to back until stopped."""

    def __init__(self, stack: Stack) -> None:
        self._stack = stack
        self._stop = threading.Event()
        self.sent: list[Sent] = []
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(2)]

    def _client(self) -> None:
        while not self._stop.is_set():
            at = time.monotonic()
            try:
                response = chat(self._stack, SHORT)
                route = response.headers.get("x-spillover-route", "")
                self.sent.append(Sent(at, response.status_code, route, response.headers.get("x-spillover-reason", "")))
            except httpx.HTTPError as exc:
                self.sent.append(Sent(at, 0, "", type(exc).__name__))

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=130)


def ramp_back_bound_s(stack: Stack) -> float:
    """The longest the ramp back may take once the new replica reports fresh stats, from the health
    settings: the rest of the red cool-down, the recovery probes (or a half-open trial) and every ramp
    step, plus one probe period of phase and a few seconds of polling."""
    health = stack.config.resilience.health
    probes = health.recovery_probes * health.recovery_probe_s + health.recovery_probe_s
    return health.cooldown_s + probes + len(health.ramp) * health.ramp_step_s + 5.0


def _local_health(stack: Stack) -> dict:
    view = httpx.get(f"{stack.base_url}/v1/spillover/resilience", timeout=10).json()
    return view["health"].get(f"local:{QWEN}", {})


@pytest.fixture
def restores_the_model(stack: Stack) -> Iterator[None]:
    """After the test: only the new replica on the board, fresh, and the resilience state reset."""
    yield
    deadline = time.monotonic() + 180  # the new replica starting, the dead one's reading forgotten
    replicas = qwen_replicas(stack)
    while not (len(replicas) == 1 and not replicas[0]["stale"]):
        assert time.monotonic() < deadline, f"the board did not settle on one fresh replica: {replicas}"
        time.sleep(1)
        replicas = qwen_replicas(stack)
    httpx.post(f"{stack.base_url}/v1/spillover/resilience/reset", timeout=10).raise_for_status()


@pytest.mark.usefixtures("restores_the_model")
def test_killed_replica_under_load_loses_nothing_and_ramps_back(stack: Stack) -> None:
    httpx.post(f"{stack.base_url}/v1/spillover/resilience/reset", timeout=10).raise_for_status()
    assert chat_until_local(stack, SHORT, "kill")[0].headers["x-spillover-route"] == "local"
    max_age = stack.config.telemetry.max_age_s
    private_ids: list[str] = []
    with Load(stack) as load:
        time.sleep(2)
        name, namespace = _replica_actor()
        ray.kill(ray.get_actor(name, namespace=namespace))
        killed_at = time.monotonic()
        time.sleep(max_age + 1.5)
        private_id = f"private-down-{uuid.uuid4().hex}"
        private_ids.append(private_id)
        private = chat(stack, SHORT, request_id=private_id, headers={"x-spillover-residency": "local_only"})
        # Bounds from the config, not from one machine's speed: the new replica may take up to the
        # readiness timeout to start (its engine's load differs between CPUs); once its stats are fresh, the
        # ramp back must end within what the health settings promise (ramp_back_bound_s)
        start_deadline = killed_at + stack.config.gateway.readiness_timeout_s
        health: dict = {}
        went_red = False  # ~30 s after the kill (stale_red_s, or 3 failed 10 s liveness probes), well before
        fresh_at: float | None = None  # Serve's new replica has loaded its engine; diverted until then
        first_fresh: float | None = None  # the new replica's first fresh stats, red or not yet
        while True:
            health = _local_health(stack)
            went_red = went_red or health.get("state") == "red"
            fresh = any(not r["stale"] for r in qwen_replicas(stack))
            first_fresh = first_fresh or (time.monotonic() if fresh else None)
            if fresh_at is None and went_red and fresh:
                fresh_at = time.monotonic()
            if went_red and health.get("state") == "green" and not health.get("ramping"):
                break
            if fresh_at is None:
                assert time.monotonic() < start_deadline, f"no new replica within the readiness timeout: {health}"
            else:
                assert time.monotonic() < fresh_at + ramp_back_bound_s(stack), (
                    f"not ramped back {ramp_back_bound_s(stack):.0f}s after the new replica's stats: {health}"
                )
            time.sleep(0.5)
        recovered_at = time.monotonic()
        time.sleep(3)  # local traffic after the ramp
    sent = load.sent
    failed = [s for s in sent if s.status != 200]
    print(
        f"\nkill under load: {len(sent)} requests, {len(failed)} failed; new replica fresh "
        f"{(fresh_at or recovered_at) - killed_at:.1f}s after the kill, ramp complete {recovered_at - killed_at:.1f}s "
        f"after it (bound {ramp_back_bound_s(stack):.0f}s after fresh)"
    )
    assert not failed, f"non-streamed requests failed: {failed[:5]}"
    first_cloud = min((s.at for s in sent if s.at >= killed_at and s.route == "cloud"), default=None)
    assert first_cloud is not None and first_cloud - killed_at <= max_age + 1.0
    assert health.get("state") == "green", f"the local model never recovered: {health}"
    transitions = health["transitions"]
    last_red = max(i for i, t in enumerate(transitions) if t["to"] == "red")
    ramp = transitions[last_red + 1 :]
    assert [t["share"] for t in ramp][:3] == [0.2, 0.5, 1.0], transitions
    # the first time it went red (share 0) after the kill, and the next transition: half-open trials or the ramp.
    # A recovery may start over (seen on a loaded 2-core machine: the new replica's first reading went stale under
    # its first ramp request, "request failed while ramping at 20%"); requests sent in a later recovery are trials
    # and ramp shares, not traffic that should have stayed off it
    wall = time.time() - time.monotonic()  # wall clock - monotonic
    entered = min(
        i for i, t in enumerate(transitions) if t["to"] == "red" and t["share"] == 0 and t["at"] >= killed_at + wall
    )
    reopened = transitions[entered + 1]["at"] - wall
    # traffic off it: every request sent from 1 s after staleness until it took trials again went to the cloud —
    # or until the new replica's first fresh stats, where those came first (on a fast CPU it loads in ~30 s, as the
    # liveness probes' third failure turns health red): fresh stats end the diversion by staleness at once. That
    # moment is seen here one poll late (0.5 s and two reads), so the window stops 1.5 s before it
    back = min(reopened - 0.5, first_fresh - 1.5 if first_fresh is not None else reopened)
    off = [s for s in sent if killed_at + max_age + 1.0 <= s.at < back]
    assert off and all(s.route == "cloud" for s in off), [s for s in off if s.route != "cloud"][:3]
    assert any(s.route == "local" for s in sent if s.at > recovered_at), "local traffic did not come back"
    assert private.status_code in (200, 429, 503), private.text
    assert all(pid not in cloud_requests(stack) for pid in private_ids)
