"""The engine itself goes wrong while the replica around it stays up: frozen under load, or computing
wrong numbers mid-life. Both on `qwen2-tiny-random` (float32 eager: its replacement starts in seconds).

* Frozen (SIGSTOP of its `VLLM::` processes, as a deadlocked or wedged engine would be): vLLM's own
  health check still says "healthy". The replica sees its engine hold requests without a step for
  `models[].stall_s`, reports the fault (the gateway stops routing to it), kills the engine (the
  requests it held fail at once: those that sent no byte fail over, a stream that did ends with the
  error event) and fails Serve's health check, so Serve replaces it.
* Numerics gone wrong (the running model's weights zeroed through the replica's own `collective_rpc`,
  the RLHF weight-sync hook, with vLLM's `reset_weights`: every greedy token changes): the next periodic
  numerics check, within `models[].numerics.interval_s`, fails; the replica leaves routing at once with
  the reason, and Serve replaces it.

Every bound is the config's: stall_s, numerics.interval_s, the telemetry push and staleness periods,
the readiness timeout for the new replica's start. Each test leaves one fresh replica with its
numerics passed and the resilience state reset.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import psutil
import pytest
from ray import serve

from cluster.render import APP_NAME
from tests.integration.conftest import Stack, wait_until_local_models_green
from tests.integration.qwen_load import QWEN, SHORT, chat, chat_until_local, qwen_replicas
from tests.own_processes import own_processes

pytestmark = pytest.mark.integration


def engine_processes(model: str) -> list[psutil.Process]:
    """The `VLLM::` processes under the model's replica actor (this machine is the whole cluster)."""
    found = []
    for proc in own_processes():
        cmdline = " ".join(proc.info["cmdline"] or [])
        if f"SpilloverLLMServer:{model}" in cmdline and "ServeReplica" in cmdline:
            found += [c for c in proc.children(recursive=True) if c.name().startswith("VLLM::")]
    return found


def _settings(stack: Stack) -> Any:
    spec = stack.config.model(QWEN)
    assert spec is not None and spec.stall_s is not None and spec.numerics is not None
    return spec


def _one_replica(stack: Stack) -> dict[str, Any]:
    replicas = [r for r in qwen_replicas(stack) if not r["stale"]]
    assert len(replicas) == 1, replicas
    return replicas[0]


def _wait_for(stack: Stack, test: Any, timeout_s: float, what: str) -> dict[str, Any]:
    """The first qwen replica `test` accepts, read within `timeout_s`; a read that times out is read again
    within the same bound (a loaded 2-core machine may be slow to answer one)."""
    deadline = time.monotonic() + timeout_s
    replicas: list[dict[str, Any]] = []
    while True:
        try:
            replicas = qwen_replicas(stack)
        except httpx.TimeoutException:
            replicas = []
        for replica in replicas:
            if test(replica):
                return replica
        assert time.monotonic() < deadline, f"{what} within {timeout_s:.0f}s: {replicas}"
        time.sleep(0.2)


@pytest.fixture
def fresh_replica_after(stack: Stack) -> Iterator[None]:
    """After the test: any stopped engine process killed, one fresh replica whose numerics passed, health green."""
    yield
    for proc in engine_processes(QWEN):
        if proc.status() == psutil.STATUS_STOPPED:
            proc.kill()
    timeout = stack.config.gateway.readiness_timeout_s
    deadline = time.monotonic() + timeout
    while True:
        replicas = qwen_replicas(stack)
        fresh = [r for r in replicas if not r["stale"]]
        if len(replicas) == 1 and len(fresh) == 1 and fresh[0]["numerics"] == "passed" and not fresh[0]["fault"]:
            break
        assert time.monotonic() < deadline, f"no single fresh, checked replica after {timeout:.0f}s: {replicas}"
        time.sleep(1)
    httpx.post(f"{stack.base_url}/v1/spillover/resilience/reset", timeout=10).raise_for_status()
    wait_until_local_models_green(stack)


class Load:
    """Two clients sending short non-streamed requests back to back until stopped."""

    def __init__(self, stack: Stack) -> None:
        self._stack = stack
        self._stop = threading.Event()
        self.sent: list[tuple[float, float, int, str]] = []  # sent at, seconds, status, route
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(2)]

    def _client(self) -> None:
        while not self._stop.is_set():
            at = time.monotonic()
            try:
                response = chat(self._stack, SHORT)
                self.sent.append(
                    (at, time.monotonic() - at, response.status_code, response.headers.get("x-spillover-route", ""))
                )
            except httpx.HTTPError as exc:
                self.sent.append((at, time.monotonic() - at, 0, type(exc).__name__))

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=130)


def _stream_until_end(stack: Stack, events: list[str], started: threading.Event) -> None:
    """A long local-only stream; its events (the data payloads) in `events`."""
    body = {"model": QWEN, "messages": SHORT, "max_tokens": 600, "ignore_eos": True, "stream": True}
    headers = {"x-spillover-residency": "local_only", "x-request-id": f"frozen-stream-{uuid.uuid4().hex}"}
    with httpx.stream("POST", f"{stack.openai_base}/chat/completions", json=body, headers=headers, timeout=300) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line.removeprefix("data: "))
                started.set()


@pytest.mark.usefixtures("fresh_replica_after")
def test_frozen_engine_under_load_is_detected_failed_over_and_replaced(stack: Stack) -> None:
    spec = _settings(stack)
    push = stack.config.telemetry.max_age_s  # a reading at least this often
    httpx.post(f"{stack.base_url}/v1/spillover/resilience/reset", timeout=10).raise_for_status()
    before = _one_replica(stack)
    assert before["numerics"] == "passed"
    assert chat_until_local(stack, SHORT, "frozen")[0].headers["x-spillover-route"] == "local"
    events: list[str] = []
    started = threading.Event()
    stream = threading.Thread(target=_stream_until_end, args=(stack, events, started), daemon=True)
    with Load(stack) as load:
        stream.start()
        assert started.wait(30), "the stream sent nothing"
        frozen = engine_processes(QWEN)
        assert frozen, "no engine processes found under the qwen replica"
        for proc in frozen:
            proc.send_signal(signal.SIGSTOP)
        frozen_at = time.monotonic()
        # the fault is reported within stall_s (and a push), while the replica still stands
        faulted = _wait_for(
            stack, lambda r: (r["fault"] or "").startswith("engine stalled"), spec.stall_s + 5 * push + 5, "stall seen"
        )
        seen_at = time.monotonic()
        stream.join(timeout=spec.stall_s + 30)
        assert not stream.is_alive(), "the local stream still hangs on the frozen engine"
        # Serve replaces the replica: a new one, fresh, its numerics passed
        _wait_for(
            stack,
            lambda r: r["replica_id"] != before["replica_id"] and not r["stale"] and r["numerics"] == "passed",
            stack.config.gateway.readiness_timeout_s,
            "a new replica",
        )
        time.sleep(2)
    print(f"\nfrozen engine: fault seen {seen_at - frozen_at:.1f}s after SIGSTOP (stall_s {spec.stall_s:g})")
    assert "took no step" in faulted["fault"]
    assert all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in frozen), "the frozen engine lives on"
    failed = [s for s in load.sent if s[2] != 200]
    assert not failed, f"requests failed while the engine was frozen: {failed[:5]}"
    slowest = max(s[1] for s in load.sent if s[0] >= frozen_at - 1)
    assert slowest <= spec.stall_s + 10 * push + 10, f"a request waited {slowest:.1f}s on the frozen engine"
    last = [json.loads(e) for e in events if e != "[DONE]"][-1]
    assert "error" in last, f"the stream did not end with the error event: {events[-3:]}"
    assert isinstance(last["error"]["code"], str), last  # the gateway's own error event, not the engine's


@pytest.mark.usefixtures("fresh_replica_after")
def test_numerics_gone_wrong_mid_life_leaves_routing_within_the_interval(stack: Stack) -> None:
    spec = _settings(stack)
    push = stack.config.telemetry.max_age_s  # a reading at least this often
    assert spec.numerics is not None
    httpx.post(f"{stack.base_url}/v1/spillover/resilience/reset", timeout=10).raise_for_status()
    before = _one_replica(stack)
    assert before["numerics"] == "passed"

    # vLLM's worker method for weight-transfer tests: every weight of the running model set to zero, through
    # the replica's own RLHF hook (a method name: vLLM sends no callables to its workers by default)
    handle = serve.get_deployment_handle(f"SpilloverLLMServer:{QWEN}", app_name=APP_NAME)
    handle.collective_rpc.remote(method="reset_weights").result(timeout_s=60)
    corrupted_at = time.monotonic()
    faulted = _wait_for(
        stack,
        lambda r: (r["fault"] or "").startswith("numerics check failed"),
        spec.numerics.interval_s + spec.numerics.timeout_s + 5 * push + 5,
        "the numerics fault",
    )
    seen_at = time.monotonic()  # on the gateway's own snapshot: its next plan sees it
    readyz = httpx.get(f"{stack.base_url}/readyz", timeout=10)
    reply = chat(stack, SHORT)
    assert readyz.status_code == 503 and "numerics check failed" in readyz.text, readyz.text
    assert reply.status_code == 200 and reply.headers["x-spillover-route"] == "cloud", reply.headers
    assert "numerics check failed" in reply.headers["x-spillover-reason"]
    print(
        f"\nnumerics fault seen {seen_at - corrupted_at:.1f}s after the corruption "
        f"(interval {spec.numerics.interval_s:g}s)"
    )
    assert "agree with the float32 reference" in faulted["fault"]
    _wait_for(
        stack,
        lambda r: r["replica_id"] != before["replica_id"] and not r["stale"] and r["numerics"] == "passed",
        stack.config.gateway.readiness_timeout_s,
        "a new replica",
    )
