"""The operator's traffic API over the real Starlette app: admin only, hostile bodies, drain, pin,
and the standby's dry-run before a switch (fakes: tests/unit/traffic_fixture.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.unit.traffic_fixture import ADMIN, APP, TrafficWorld, traffic_config

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "a",
        "schema": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
    },
}


async def test_the_traffic_routes_need_an_admin_key() -> None:
    world = TrafficWorld(traffic_config(), auth=True)
    http, _, _ = world.gateway()
    drain = {"action": "drain", "target": "cloud:sim"}
    async with world.client(http) as client:
        assert (await client.get("/v1/spillover/traffic")).status_code == 401
        assert (await client.get("/v1/spillover/traffic", headers=APP)).status_code == 403
        assert (await client.post("/v1/spillover/traffic", json=drain)).status_code == 401
        refused = await client.post("/v1/spillover/traffic", json=drain, headers=APP)
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
        assert world.board.sync("x", [])[0]["drains"] == {}  # nothing changed
        done = await client.post("/v1/spillover/traffic", json=drain, headers=ADMIN)
        assert done.status_code == 200 and "cloud:sim" in done.json()["traffic"]["drains"]
        assert (await client.get("/v1/spillover/traffic", headers=ADMIN)).json()["version"] == 1


BAD_BODIES: list[tuple[Any, str | None]] = [
    (b"", None),
    (b"not json", None),
    (b"[1, 2]", None),
    (b'{"action": "drain"}', "target"),
    (b'{"action": "explode"}', "action"),
    (b'{"action": 3}', "action"),
    (b'{"action": "drain", "target": "cloud:nowhere"}', "target"),
    (b'{"action": "drain", "target": "http://169.254.169.254/"}', "target"),
    (b'{"action": "drain", "target": ["cloud:sim"]}', "target"),
    (b'{"action": "drain", "target": "cloud:sim", "extra": 1}', "extra"),
    (b'{"action": "drain", "target": "cloud:sim", "reason": "' + b"x" * 300 + b'"}', "reason"),
    (b'{"action": "pin", "model": "nope", "target": "cloud:sim"}', "model"),
    (b'{"action": "pin", "model": "m", "scenario": "unknown", "target": "cloud:sim"}', "scenario"),
    (b'{"action": "switch", "model": "m", "primary": "local:m"}', "standby"),
    (b'{"action": "switch", "model": "m", "primary": "local:m", "standby": "local:m"}', "standby"),
    (b'{"action": "switch", "model": "m", "primary": "local:m", "standby": "cloud:sim", "step_s": -1}', "step_s"),
    (b'{"action": "switch", "model": "m", "primary": "local:m", "standby": "cloud:sim", "step_s": 1e999}', "step_s"),
    (b'{"action": "switch", "model": "m", "primary": "local:m", "standby": "cloud:sim", "step_s": true}', "step_s"),
    (b'{"action": "switch", "model": "m", "primary": "local:m", "standby": "cloud:sim", "min_requests": 0}', None),
    (b'{"action": "switch", "model": "m", "primary": "local:m", "standby": "cloud:sim", "dry_run": []}', "dry_run"),
    (b'{"action": "switch", "model": "m", "primary": "local:m", "standby": "cloud:sim", "dry_run": {"x": 1}}', None),
    (
        b'{"action": "switch", "model": "m", "primary": "local:m", "standby": "cloud:sim",'
        b' "dry_run": {"messages": "hi"}}',
        "dry_run",
    ),
    (b'{"action": "rollback"}', "model"),
    (b"[" * 5000 + b"]" * 5000, None),
]


@pytest.mark.parametrize(("raw", "param"), BAD_BODIES)
async def test_bad_commands_are_a_clear_400_and_change_nothing(raw: bytes, param: str | None) -> None:
    world = TrafficWorld(traffic_config())
    http, _, _ = world.gateway()
    async with world.client(http) as client:
        response = await client.post("/v1/spillover/traffic", content=raw)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_traffic_command"
    if param is not None:
        assert error["param"] == param
    assert "Traceback" not in response.text and "127.0.0.1" not in response.text
    assert world.board.sync("x", [])[0]["version"] == 0


async def test_a_huge_body_is_413_and_a_wrong_method_405() -> None:
    world = TrafficWorld(traffic_config())
    http, _, _ = world.gateway()
    async with world.client(http) as client:
        huge = await client.post("/v1/spillover/traffic", content=b"{" + b" " * (9 * 1024 * 1024) + b"}")
        put = await client.put("/v1/spillover/traffic", json={"action": "drain", "target": "cloud:sim"})
    assert huge.status_code == 413 and put.status_code == 405


async def test_a_drained_target_takes_no_new_requests_and_a_pin_keeps_only_its_target() -> None:
    world = TrafficWorld(traffic_config())
    http, _, _ = world.gateway()
    async with world.client(http) as client:
        assert (await client.post("/v1/chat/completions", json=CHAT)).headers["x-spillover-target"] == "local:m"
        await client.post("/v1/spillover/traffic", json={"action": "drain", "target": "local:m", "reason": "upgrade"})
        drained = await client.post("/v1/chat/completions", json=CHAT, headers={"x-request-id": "d1"})
        assert drained.headers["x-spillover-target"] == "cloud:sim"
        record = (await client.get("/v1/spillover/decisions/d1")).json()
        why = {c["target"]: c["reason"] for c in record["candidates"] if c["status"] == "unavailable"}
        assert why["local:m"] == "drained by the operator: upgrade"
        await client.post("/v1/spillover/traffic", json={"action": "undrain", "target": "local:m"})
        pin = {"action": "pin", "model": "m", "scenario": "chat", "target": "cloud:spare"}
        await client.post("/v1/spillover/traffic", json=pin)
        pinned = await client.post("/v1/chat/completions", json=CHAT, headers={"x-business-scenario": "chat"})
        other = await client.post("/v1/chat/completions", json=CHAT)
        assert pinned.headers["x-spillover-target"] == "cloud:spare"  # only for that scenario
        assert other.headers["x-spillover-target"] == "local:m"
        await client.post("/v1/spillover/traffic", json={"action": "unpin", "model": "m", "scenario": "chat"})
        history = (await client.get("/v1/spillover/traffic")).json()["history"]
    assert [h["action"] for h in history] == ["drain", "undrain", "pin", "unpin"]


async def test_a_standby_that_breaks_the_scenario_schema_is_refused_by_its_dry_run_and_recorded() -> None:
    world = TrafficWorld(traffic_config())
    world.sim.answer = "Sure! Here is some prose, not JSON."
    http, parts, _ = world.gateway()
    switch = {
        "action": "switch",
        "model": "m",
        "primary": "local:m",
        "standby": "cloud:sim",
        "dry_run": {"response_format": SCHEMA},
    }
    async with world.client(http) as client:
        refused = await client.post("/v1/spillover/traffic", json=switch)
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["code"] == "dry_run_failed"
        assert "127.0.0.1" not in refused.text
        view = (await client.get("/v1/spillover/traffic")).json()
        assert view["switches"] == {} and view["history"][-1]["action"] == "switch_refused"
        metrics = (await client.get("/metrics")).text
        assert 'spillover_dry_runs_total{outcome="failed",target="cloud:sim"} 1.0' in metrics
        after = await client.post("/v1/chat/completions", json=CHAT)
        assert after.headers["x-spillover-target"] == "local:m"  # no traffic moved
        world.sim.answer = json.dumps({"answer": "OK"})
        started = await client.post("/v1/spillover/traffic", json=switch)
    assert started.status_code == 200, started.text
    assert started.json()["traffic"]["switches"]["m"]["phase"] == "running"
    assert len(world.sim.calls) == 2  # one dry-run each; no client request reached the standby
    assert parts.traffic.view()["migrations"]["m"]["share"] == 0.01


async def test_a_dry_run_of_a_standby_that_fails_or_does_not_serve_the_model() -> None:
    world = TrafficWorld(traffic_config())
    from router.errors import UpstreamError

    world.spare.script = [UpstreamError("boom at http://10.0.0.1/v1")]
    http, _, _ = world.gateway()
    switch = {"action": "switch", "model": "m", "primary": "local:m", "standby": "cloud:spare"}
    async with world.client(http) as client:
        failed = await client.post("/v1/spillover/traffic", json=switch)
    assert failed.status_code == 409 and failed.json()["error"]["code"] == "dry_run_failed"
    assert "10.0.0.1" not in failed.text
