"""Failure classification and the retry table: real `router.errors` instances, table-driven."""

from __future__ import annotations

import dataclasses

import pytest

from router.errors import (
    ContextLengthExceeded,
    ContractViolation,
    InvalidRequest,
    LocalCapacityExhausted,
    ModelNotFound,
    NoCapableModel,
    NoTargetFitsContext,
    ProviderContextExceeded,
    ProviderOverloaded,
    ProviderRateLimited,
    ProviderRejected,
    RequestError,
    RequestTimeout,
    TargetUnavailable,
    TenantRateLimited,
    Unauthorized,
    UpstreamError,
)
from router.resilience.failure import RETRY_TABLE, FailureClass, Rule, classify, rule_for

F = FailureClass

# Each error built the way the provider adapter / engine path / gateway builds it.
CASES: list[tuple[str, RequestError, FailureClass]] = [
    ("unreachable", TargetUnavailable("connect failed", code="provider_unreachable"), F.TRANSPORT),
    ("local target unavailable", TargetUnavailable("no healthy replica"), F.TRANSPORT),
    ("provider timeout", TargetUnavailable("timed out", code="provider_timeout"), F.TIMEOUT),
    ("request timeout", RequestTimeout("deadline passed"), F.TIMEOUT),
    ("provider 429", ProviderRateLimited("slow down", retry_after_s=2.0), F.RATE_LIMITED),
    ("provider 429 no retry-after", ProviderRateLimited("slow down"), F.RATE_LIMITED),
    ("provider overloaded (529)", ProviderOverloaded("overloaded", retry_after_s=3.0), F.OVERLOADED),
    ("provider overloaded, no retry-after", ProviderOverloaded("overloaded"), F.OVERLOADED),
    ("provider 5xx", UpstreamError("HTTP 503", code="provider_error"), F.SERVER),
    ("local engine failure", UpstreamError("engine died"), F.SERVER),
    ("provider stream error event", UpstreamError("odd", code="provider_stream_error"), F.SERVER),
    ("unknown upstream code", UpstreamError.quoting("odd", "an_upstreams_own_code"), F.SERVER),
    ("malformed body", UpstreamError("not JSON", code="provider_malformed"), F.PROTOCOL),
    ("cut before client saw anything", UpstreamError("reset", code="provider_cut"), F.CUT),
    ("contract violation", ContractViolation("bad JSON", errors=["$.a: required"]), F.CONTRACT),
    ("provider context window", ProviderContextExceeded("prompt does not fit"), F.CAPABILITY),
    ("auth failed", UpstreamError("HTTP 401", code="provider_auth_failed"), F.AUTH),
    ("key unset", TargetUnavailable("OPENAI_API_KEY unset", code="provider_not_configured"), F.NOT_CONFIGURED),
    ("provider 400", ProviderRejected("bad param", status_code=400, param="temperature"), F.CLIENT),
    ("provider 404", ProviderRejected("no such model", status_code=404), F.CLIENT),
    ("provider 422", ProviderRejected("unprocessable", status_code=422), F.CLIENT),
    ("provider 400 with its own code", ProviderRejected("x", code="provider_timeout"), F.CLIENT),
    ("invalid request", InvalidRequest("missing messages", param="messages"), F.CLIENT),
    ("context length", ContextLengthExceeded("too long"), F.CLIENT),
    ("model not found", ModelNotFound("no alias"), F.CLIENT),
    ("no capable model", NoCapableModel("none", reasons=[]), F.CLIENT),
    ("no target fits context", NoTargetFitsContext("none", reasons=[]), F.CLIENT),
    ("gateway 401", Unauthorized("bad key"), F.CLIENT),
    ("tenant 429", TenantRateLimited("tenant over rpm", retry_after_s=1.0), F.CLIENT),
    ("local capacity 429", LocalCapacityExhausted("full"), F.CLIENT),
    ("plain request error", RequestError("generic"), F.CLIENT),
]


@pytest.mark.parametrize(("error", "expected"), [(e, c) for _, e, c in CASES], ids=[n for n, _, _ in CASES])
def test_classify(error: RequestError, expected: FailureClass) -> None:
    assert classify(error) is expected
    assert rule_for(error) is RETRY_TABLE[expected]


def test_every_class_has_a_case_and_a_rule() -> None:
    assert {c for _, _, c in CASES} == set(FailureClass)
    assert set(RETRY_TABLE) == set(FailureClass)


class _ServerSide(RequestError):
    """A non-upstream RequestError with a 5xx status: still the server's fault."""

    status_code = 500


def test_non_upstream_5xx_is_server() -> None:
    assert classify(_ServerSide("boom")) is F.SERVER


def test_leaf_class_wins_over_code() -> None:
    """A 429 or a timeout is known by its type even if someone passed an odd code."""
    assert classify(ProviderRateLimited("x", code="provider_error")) is F.RATE_LIMITED
    assert classify(RequestTimeout("x", code="upstream_error")) is F.TIMEOUT


def test_target_unavailable_not_confused_with_rate_limit() -> None:
    """ProviderRateLimited subclasses TargetUnavailable; the parent must not classify as 429."""
    assert classify(TargetUnavailable("x")) is not F.RATE_LIMITED


# The table, row by row: (retry_same, fail_over, breaker_failure, cools_domain, marks_black).
EXPECTED_RULES: dict[FailureClass, tuple[bool, bool, bool, bool, bool]] = {
    F.TRANSPORT: (True, True, True, False, False),
    F.TIMEOUT: (False, True, True, False, False),
    F.RATE_LIMITED: (False, True, False, True, False),
    F.OVERLOADED: (False, True, False, True, False),
    F.SERVER: (True, True, True, False, False),
    F.PROTOCOL: (False, True, True, False, False),
    F.CUT: (True, True, True, False, False),
    F.CONTRACT: (False, True, False, False, False),
    F.CAPABILITY: (False, True, False, False, False),
    F.AUTH: (False, True, True, False, True),
    F.NOT_CONFIGURED: (False, True, False, False, True),
    F.CLIENT: (False, False, False, False, False),
}


@pytest.mark.parametrize("failure", list(FailureClass), ids=str)
def test_retry_table_row(failure: FailureClass) -> None:
    rule = RETRY_TABLE[failure]
    assert dataclasses.astuple(rule) == EXPECTED_RULES[failure]
    assert rule.retryable == (rule.retry_same or rule.fail_over)


def test_only_client_errors_go_straight_back() -> None:
    assert [c for c, r in RETRY_TABLE.items() if not r.retryable] == [F.CLIENT]


def test_table_and_rules_are_immutable() -> None:
    with pytest.raises(TypeError):
        RETRY_TABLE[F.CLIENT] = Rule(fail_over=True)  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        RETRY_TABLE[F.CLIENT].fail_over = True  # type: ignore[misc]
    assert RETRY_TABLE[F.CLIENT].fail_over is False
