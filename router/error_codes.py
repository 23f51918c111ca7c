"""Every error code spillover puts in an error body, as one `StrEnum`.

A code is a public interface: clients branch on `error.code` of the OpenAI error shape
(docs/http-api.md "Errors"), decision records keep it per attempt, and the retry table
(router/resilience/failure.py) classifies an `UpstreamError` by it. So the values never change; a member is
added, never renamed. Each member *is* its string (`ErrorCode.INVALID_JSON == "invalid_json"`,
`json.dumps` and f-strings give the bare value), so a body, a log line or a record reads the same
as when the codes were plain strings.

The classes of router/errors.py declare their default code as a member; a raiser that needs another
code passes a member (`InvalidRequest(..., code=ErrorCode.INVALID_JSON)`). The one code that is not a
member is one quoted from another system: an upstream's own error event passed on after the first
byte of a stream (`RequestError.quoting`, serve_apps/streams/account.py). tests/unit/test_error_codes.py
checks that every code the code base raises is a member and that the retry table names only members.
"""

from __future__ import annotations

from enum import StrEnum, unique


@unique
class ErrorCode(StrEnum):
    """The `error.code` values of spillover's error answers (docs/http-api.md "Errors")."""

    # the request itself (400, 404, 408, 413, 431)
    INVALID_REQUEST = "invalid_request"
    INVALID_JSON = "invalid_json"
    INVALID_JSON_SCHEMA = "invalid_json_schema"
    INVALID_SESSION = "invalid_session"
    INVALID_FEEDBACK = "invalid_feedback"
    INVALID_TRAFFIC_COMMAND = "invalid_traffic_command"
    INVALID_IDEMPOTENCY_KEY = "invalid_idempotency_key"
    IDEMPOTENCY_KEY_REUSED = "idempotency_key_reused"
    IDEMPOTENCY_NOT_SUPPORTED = "idempotency_not_supported"  # no longer raised: streams are replayed too
    UNKNOWN_SCENARIO = "unknown_scenario"
    SCENARIO_REQUIRED = "scenario_required"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    MODEL_NOT_FOUND = "model_not_found"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    HTTP_ERROR = "http_error"
    TICKET_NOT_FOUND = "ticket_not_found"
    NO_TELEMETRY = "no_telemetry"
    QUALITY_DISABLED = "quality_disabled"
    REQUEST_TOO_LARGE = "request_too_large"
    REQUEST_HEADERS_TOO_LARGE = "request_headers_too_large"
    REQUEST_HEADER_TIMEOUT = "request_header_timeout"
    REQUEST_BODY_TIMEOUT = "request_body_timeout"

    # who is asking, and how much (401, 402, 403, 409, 429)
    INVALID_API_KEY = "invalid_api_key"
    FORBIDDEN = "forbidden"
    TENANT_RATE_LIMITED = "tenant_rate_limited"
    FEEDBACK_RATE_LIMITED = "feedback_rate_limited"
    TENANT_CONCURRENCY_EXCEEDED = "tenant_concurrency_exceeded"
    TENANT_BUDGET_EXCEEDED = "tenant_budget_exceeded"
    IDEMPOTENCY_KEY_IN_USE = "idempotency_key_in_use"
    IDEMPOTENCY_IN_PROGRESS = "idempotency_in_progress"  # a streamed repeat while the first still runs
    FEEDBACK_EXISTS = "feedback_exists"
    DRY_RUN_FAILED = "dry_run_failed"

    # routing (422, 429, 503)
    NO_CAPABLE_MODEL = "no_capable_model"
    CARRIED_CONTEXT_RESTRICTED = "carried_context_restricted"
    LOCAL_CAPACITY_EXHAUSTED = "local_capacity_exhausted"
    TARGET_UNAVAILABLE = "target_unavailable"
    NON_CORE_SHED = "non_core_shed"
    CLUSTER_STATE_UNAVAILABLE = "cluster_state_unavailable"  # an operator command's head-node actor did not answer

    # a target failed (5xx; the retry table of router/resilience/failure.py reads these)
    UPSTREAM_ERROR = "upstream_error"
    REQUEST_TIMEOUT = "request_timeout"
    REPLICAS_STALE = "replicas_stale"
    REPLICA_FAULT = "replica_fault"
    STREAM_CUT = "stream_cut"
    CONTRACT_VIOLATION = "contract_violation"
    TICKET_ANSWER_DROPPED = "ticket_answer_dropped"
    PROVIDER_UNREACHABLE = "provider_unreachable"
    PROVIDER_TIMEOUT = "provider_timeout"
    PROVIDER_RATE_LIMITED = "provider_rate_limited"
    PROVIDER_OVERLOADED = "provider_overloaded"
    PROVIDER_ERROR = "provider_error"
    PROVIDER_STREAM_ERROR = "provider_stream_error"
    PROVIDER_MALFORMED = "provider_malformed"
    PROVIDER_REPLY_TOO_LARGE = "provider_reply_too_large"
    PROVIDER_CUT = "provider_cut"
    PROVIDER_AUTH_FAILED = "provider_auth_failed"
    PROVIDER_NOT_CONFIGURED = "provider_not_configured"
    PROVIDER_REJECTED = "provider_rejected"

    # the gateway itself (500)
    INTERNAL_ERROR = "internal_error"

    @classmethod
    def of(cls, code: str | None) -> ErrorCode | None:
        """The member whose value is `code`; None for None and for a code that is not one (quoted)."""
        try:
            return None if code is None else cls(code)
        except ValueError:
            return None
