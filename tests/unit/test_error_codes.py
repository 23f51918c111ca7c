"""The error codes: one `StrEnum` (router/error_codes.py), its values pinned, every raiser and the retry
table speaking only its members."""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import router.errors as errors
from router.error_codes import ErrorCode
from router.errors import RequestError, UpstreamError
from router.resilience.failure import RETRY_TABLE, UPSTREAM_CODES, FailureClass, classify, rule_for

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = ("router", "cluster", "serve_apps", "bench", "spillover")
# bench/cloud_sim imitates the cloud providers: its codes are theirs (`not_found_error`, `content_filter`)
FOREIGN = ("bench/cloud_sim",)

# The public interface as it stood when the codes became an enum: a value may be added, never changed.
PINNED = {
    "carried_context_restricted", "context_length_exceeded", "contract_violation", "dry_run_failed",
    "feedback_exists", "feedback_rate_limited", "forbidden", "http_error", "idempotency_key_in_use",
    "idempotency_key_reused", "idempotency_not_supported", "internal_error", "invalid_api_key",
    "invalid_feedback", "invalid_idempotency_key", "invalid_json", "invalid_json_schema", "invalid_request",
    "invalid_session", "invalid_traffic_command", "local_capacity_exhausted", "method_not_allowed",
    "model_not_found", "no_capable_model", "no_telemetry", "non_core_shed", "not_found", "provider_auth_failed",
    "provider_cut", "provider_error", "provider_malformed", "provider_not_configured", "provider_overloaded",
    "provider_rate_limited", "provider_rejected", "provider_reply_too_large", "provider_stream_error",
    "provider_timeout", "provider_unreachable", "quality_disabled", "replica_fault", "replicas_stale",
    "request_body_timeout", "request_header_timeout", "request_headers_too_large", "request_timeout",
    "request_too_large", "scenario_required", "stream_cut", "target_unavailable", "tenant_budget_exceeded",
    "tenant_concurrency_exceeded", "tenant_rate_limited", "ticket_answer_dropped", "ticket_not_found",
    "unknown_scenario", "upstream_error",
    "idempotency_in_progress",  # added with streamed idempotency replays
    "cluster_state_unavailable",  # added: an operator command whose head-node actor is hung or gone
}  # fmt: skip


def test_the_values_are_the_public_codes_unchanged() -> None:
    assert {c.value for c in ErrorCode} == PINNED
    assert all(c.name == c.value.upper() for c in ErrorCode)


def test_a_member_reads_as_its_bare_string() -> None:
    code = ErrorCode.PROVIDER_CUT
    assert code == "provider_cut" and f"{code}" == "provider_cut" and str(code) == "provider_cut"
    assert json.dumps({"code": code}) == '{"code": "provider_cut"}'
    body = UpstreamError("cut", code=code).to_openai()
    assert json.loads(json.dumps(body))["error"]["code"] == "provider_cut"


def test_of_finds_members_and_nothing_else() -> None:
    assert ErrorCode.of("provider_error") is ErrorCode.PROVIDER_ERROR
    assert ErrorCode.of("internal") is None and ErrorCode.of(None) is None


def _subclasses(cls: type[RequestError]) -> Iterator[type[RequestError]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_every_error_class_declares_a_member() -> None:
    classes = [c for c in _subclasses(RequestError) if c.__module__ == errors.__name__]
    assert len(classes) > 30
    for cls in classes:
        assert isinstance(cls.code, ErrorCode), f"{cls.__name__}.code = {cls.code!r}"


def _production_files() -> Iterator[Path]:
    for package in PRODUCTION:
        for path in sorted((ROOT / package).rglob("*.py")):
            if not path.relative_to(ROOT).as_posix().startswith(FOREIGN):
                yield path


def _code_literals(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """String literals given as a code: `code="..."` in a call, `code = "..."` in a class body."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for keyword in node.keywords:
                if keyword.arg == "code" and isinstance(keyword.value, ast.Constant):
                    if isinstance(keyword.value.value, str):
                        yield node.lineno, keyword.value.value
        elif isinstance(node, ast.ClassDef):
            for statement in node.body:
                if isinstance(statement, ast.Assign | ast.AnnAssign):
                    targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
                    names = {t.id for t in targets if isinstance(t, ast.Name)}
                    value = statement.value
                    if "code" in names and isinstance(value, ast.Constant) and isinstance(value.value, str):
                        yield statement.lineno, value.value


def _members_named(tree: ast.AST) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "ErrorCode":
            yield node.lineno, node.attr


def test_every_code_raised_anywhere_is_a_member() -> None:
    literals, unknown = [], []
    for path in _production_files():
        tree = ast.parse(path.read_text(), filename=str(path))
        where = path.relative_to(ROOT).as_posix()
        literals += [f"{where}:{line}: {value!r}" for line, value in _code_literals(tree)]
        unknown += [
            f"{where}:{line}: ErrorCode.{name}"
            for line, name in _members_named(tree)
            if name not in ErrorCode.__members__ and name != "of"
        ]
    assert literals == [], "pass an ErrorCode member, not a string"
    assert unknown == []


def test_the_scan_sees_a_literal_code() -> None:
    tree = ast.parse('class E(RequestError):\n    code = "x"\n\nraise E("m", code="y")\n')
    assert [value for _, value in _code_literals(tree)] == ["x", "y"]


def test_the_retry_table_names_only_members() -> None:
    assert all(isinstance(code, ErrorCode) for code in UPSTREAM_CODES)
    assert set(UPSTREAM_CODES.values()) <= set(RETRY_TABLE)


@pytest.mark.parametrize("code", list(UPSTREAM_CODES))
def test_each_listed_code_classifies_as_listed(code: ErrorCode) -> None:
    if code in (ErrorCode.REQUEST_TIMEOUT, ErrorCode.CONTRACT_VIOLATION):
        return  # their classes classify by type first (router/resilience/failure.py); a bare UpstreamError is by code
    assert classify(UpstreamError("x", code=code)) is UPSTREAM_CODES[code]


def test_a_provider_stream_error_is_a_server_failure_and_retried() -> None:
    """An error event instead of the answer, before any byte reached the client: like a provider 5xx."""
    error = UpstreamError("cloud provider 'p' failed mid-stream: overloaded", code=ErrorCode.PROVIDER_STREAM_ERROR)
    assert UPSTREAM_CODES[ErrorCode.PROVIDER_STREAM_ERROR] is FailureClass.SERVER
    rule = rule_for(error)
    assert rule.retryable and rule.retry_same and rule.fail_over and rule.breaker_failure
    assert not rule.marks_black and not rule.cools_domain


def test_a_quoted_code_is_kept_verbatim_and_classified_as_server() -> None:
    error = UpstreamError.quoting("the stream failed after its first byte", "internal")
    assert error.code == "internal" and not isinstance(error.code, ErrorCode)
    assert classify(error) is FailureClass.SERVER


def test_with_message_keeps_the_class_and_every_field() -> None:
    original = UpstreamError("key sk-123 leaked", code=ErrorCode.PROVIDER_MALFORMED, param="messages")
    scrubbed = original.with_message("key *** leaked")
    assert type(scrubbed) is UpstreamError and scrubbed.code is ErrorCode.PROVIDER_MALFORMED
    assert scrubbed.param == "messages" and scrubbed.message == str(scrubbed) == "key *** leaked"
    assert original.message == "key sk-123 leaked"
