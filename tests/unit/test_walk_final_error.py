"""What a client is told when no candidate answered (serve_apps/dispatch/walk.py `Walk.final_error`): the last
failure, every candidate passed over after it, the failures before it and what the plan left out — so a
fall-over that did not happen is never left unexplained."""

from __future__ import annotations

from typing import Any

from router.error_codes import ErrorCode
from router.errors import TargetUnavailable, UpstreamError
from router.routing.capabilities import Target, cloud_target, local_target
from serve_apps.dispatch.walk import Walk


def target(provider: str | None) -> Target:
    return local_target("m", {}) if provider is None else cloud_target(provider, "m", "m")


def walk(unavailable: dict[str, str] | None = None) -> Walk:
    plan: Any = type("P", (), {"reason": "planned", "unavailable": unavailable or {}})()
    return Walk(plan, "chat", {}, "r-1", contract=None, deadline=0.0, turn=None)  # type: ignore[arg-type]


def test_the_last_failure_then_the_candidates_passed_over_after_it() -> None:
    w = walk()
    w.failed(target(None), TargetUnavailable("every replica of m went stale", code=ErrorCode.REPLICAS_STALE))
    w.skipped(target("sim"), "cloud:sim is black: provider_auth_failed")
    message = w.final_error("attempt budget spent (1 of 3, or the deadline)").message
    assert message == (
        "every replica of m went stale; then cloud:sim/m skipped: cloud:sim is black: provider_auth_failed; "
        "then attempt budget spent (1 of 3, or the deadline)"
    )


def test_earlier_failures_and_what_the_plan_left_out_are_named() -> None:
    w = walk({"cloud:other/m": "breaker open"})
    w.skipped(target("other"), "skipped before the failure")  # before the last failure: not in its "then"s
    w.failed(target("sim"), UpstreamError("timed out", code=ErrorCode.PROVIDER_TIMEOUT))
    w.failed(target(None), TargetUnavailable("every replica of m went stale", code=ErrorCode.REPLICAS_STALE))
    message = w.final_error().message
    assert message == (
        "every replica of m went stale (after cloud:sim/m failed: provider_timeout) "
        "(not tried: cloud:other/m: breaker open)"
    )


def test_nothing_tried_lists_the_refusals() -> None:
    w = walk()
    w.skipped(target("sim"), "max cost: estimated cost $1 > remaining $0.5")
    assert w.final_error().message == "no target could take the request: max cost: estimated cost $1 > remaining $0.5"
