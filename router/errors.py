"""The one error hierarchy of spillover.

Every failure a user or an operator can meet is one of these classes. Errors from
libraries (pydantic, httpx, Ray, vLLM) are translated into them at the boundary that
calls the library; nothing else in the code base raises bare library errors upward.

    SpilloverError                     base; carries a human message
    ├── ConfigError                    a config file is invalid (file, field path, reason)
    ├── ModelPrepareError              `spillover models prepare` could not build a model
    ├── ClusterError                   Ray / Serve could not be started or reached
    │   └── StoreUnavailable           the shared store (`state.url`) did not answer
    └── RequestError                   answered to an HTTP client in the OpenAI error shape
        ├── InvalidRequest       400   malformed JSON, missing/invalid fields
        │   └── ContextLengthExceeded  400  prompt + max_tokens beyond the model's window
        ├── ModelNotFound        404   the requested model alias is not configured
        ├── NotFound             404   a decision record, ticket or feature this gateway does not have
        │                              (codes not_found, ticket_not_found, no_telemetry, quality_disabled)
        ├── RouteNotFound        404   no such path (405: not with this method)
        ├── IdempotencyConflict  409   a request with the same Idempotency-Key is still running
        ├── FeedbackExists       409   a second feedback report of one source on one request
        ├── RequestTooLarge      413   the body passed gateway.max_body_bytes (found while reading it)
        ├── HeadersTooLarge      431   the request's headers passed gateway.http_limits (size or count)
        ├── RequestBodyTimeout   408   the body did not arrive within gateway.http_limits.body_timeout_s
        ├── Unauthorized         401   gateway auth is on and the API key is missing or wrong
        ├── Forbidden            403   the tenant may not call an operator endpoint
        ├── TenantRateLimited    429   the tenant passed its requests_per_minute (`retry_after_s`)
        ├── TenantConcurrencyExceeded 429  the tenant has max_concurrent requests in flight (`retry_after_s`)
        ├── TenantBudgetExceeded 402   the tenant's cloud spend this month reached its monthly_budget_usd
        ├── NoCapableModel       422   no configured target satisfies the request's contract
        │   │                          (tools, context, schema, residency, budget...); the body
        │   │                          lists each candidate's reason under "reasons"
        │   ├── NoTargetFitsContext 400  ... and length is the only obstacle (code
        │   │                            context_length_exceeded, what OpenAI clients expect)
        │   └── CarriedContextRestricted 422  ... because the context its session carries may not
        │                                go to the targets that could serve the turn (code
        │                                carried_context_restricted; router/sessions/carried.py)
        ├── LocalCapacityExhausted 429 no local room before the deadline, no burst (`retry_after_s`)
        ├── ProviderRejected     400   a cloud provider refused the request (its 400/404/422 kept)
        ├── InternalError        500   a bug in the gateway (logged with its traceback; the client gets none)
        └── UpstreamError        502   a local engine or cloud provider failed while serving the request
            ├── TicketAnswerDropped 502  a deferred request's answer was too large to keep
            ├── TargetUnavailable 503  no healthy target can take the request now (code cluster_state_unavailable:
            │                          an operator command's head-node actor did not answer, serve_apps/head_actor.py)
            │   ├── ProviderRateLimited 429  a cloud provider answered 429 (`retry_after_s`)
            │   └── ProviderOverloaded  503  a cloud provider is overloaded for everyone (Anthropic's
            │                                529; `retry_after_s` when it sent one)
            └── ContractViolation 502  an L1 answer broke its output contract on every candidate
                                       tried; the body lists the validation errors under "errors"

`RequestError.to_openai()` renders the OpenAI error body; codes are members of `router.error_codes.ErrorCode`.
"""

from __future__ import annotations

from typing import Any, Self

from router.error_codes import ErrorCode


class SpilloverError(Exception):
    """Base of every error spillover raises on purpose."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigError(SpilloverError):
    """A config file failed validation.

    `problems` holds one `(field_path, reason)` pair per problem found.
    """

    def __init__(self, path: str, problems: list[tuple[str, str]]) -> None:
        self.path = path
        self.problems = problems
        lines = [f"invalid config {path}:"]
        lines += [f"  {field}: {reason}" for field, reason in problems]
        super().__init__("\n".join(lines))


class ModelPrepareError(SpilloverError):
    """A model folder could not be built."""


class ClusterError(SpilloverError):
    """Ray or Ray Serve could not be started, reached or deployed to."""


class StoreUnavailable(ClusterError):
    """The shared store did not answer (serve_apps/state/fallback.py serves per replica meanwhile)."""


class RequestError(SpilloverError):
    """An error answered to an HTTP client."""

    status_code: int = 400
    error_type: str = "invalid_request_error"
    # an ErrorCode for every error spillover raises; any other string only through `quoting`
    code: str | None = None
    degraded: str = ""  # x-spillover-degraded of an answer from a degraded mode (router/resilience/tiers.py)

    def __init__(self, message: str, *, param: str | None = None, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        self.param = param
        if code is not None:
            self.code = code

    @classmethod
    def quoting(cls, message: str, code: str) -> Self:
        """The error with a code another system sent, kept verbatim (an upstream's error event mid-stream,
        serve_apps/streams/account.py): the one way a code that is not an `ErrorCode` enters an error."""
        error = cls(message)
        error.code = code
        return error

    def with_message(self, message: str) -> Self:
        """A copy of this error with another message (e.g. scrubbed of a secret), every other field kept."""
        copy = type(self).__new__(type(self), message)
        copy.__dict__.update(self.__dict__)
        copy.message = message
        return copy

    def to_openai(self) -> dict[str, Any]:
        return error_body(self.message, self.error_type, self.code, self.param)


def error_body(message: str, error_type: str, code: str | None, param: str | None = None) -> dict[str, Any]:
    """The OpenAI error shape every error answer of the gateway has (the one place that builds it)."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


class InvalidRequest(RequestError):
    status_code = 400
    code = ErrorCode.INVALID_REQUEST


class ContextLengthExceeded(InvalidRequest):
    code = ErrorCode.CONTEXT_LENGTH_EXCEEDED


class Unauthorized(RequestError):
    status_code = 401
    error_type = "authentication_error"
    code = ErrorCode.INVALID_API_KEY


class Forbidden(RequestError):
    status_code = 403
    error_type = "permission_error"
    code = ErrorCode.FORBIDDEN


class TenantRateLimited(RequestError):
    status_code = 429
    error_type = "rate_limit_error"
    code = ErrorCode.TENANT_RATE_LIMITED

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class FeedbackRateLimited(TenantRateLimited):
    code = ErrorCode.FEEDBACK_RATE_LIMITED


class TenantConcurrencyExceeded(RequestError):
    status_code = 429
    error_type = "rate_limit_error"
    code = ErrorCode.TENANT_CONCURRENCY_EXCEEDED

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class TenantBudgetExceeded(RequestError):
    """402, not 429: retrying soon cannot help (it lasts until the month ends or the budget is raised),
    and OpenAI clients retry a 429 on their own but not a 402."""

    status_code = 402
    error_type = "insufficient_quota"
    code = ErrorCode.TENANT_BUDGET_EXCEEDED


class ModelNotFound(RequestError):
    status_code = 404
    code = ErrorCode.MODEL_NOT_FOUND


class NotFound(RequestError):
    status_code = 404
    code = ErrorCode.NOT_FOUND


class RouteNotFound(RequestError):
    """No route for the path (404) or the method (405); `status` says which."""

    code = ErrorCode.NOT_FOUND

    def __init__(self, message: str, *, status: int = 404, code: ErrorCode | None = None) -> None:
        super().__init__(message, code=code or ErrorCode.NOT_FOUND)
        self.status_code = status


class InternalError(RequestError):
    status_code = 500
    error_type = "internal_error"
    code = ErrorCode.INTERNAL_ERROR


class IdempotencyConflict(RequestError):
    status_code = 409
    code = ErrorCode.IDEMPOTENCY_KEY_IN_USE


class FeedbackExists(RequestError):
    status_code = 409
    code = ErrorCode.FEEDBACK_EXISTS


class RequestTooLarge(RequestError):
    status_code = 413
    code = ErrorCode.REQUEST_TOO_LARGE


class HeadersTooLarge(RequestError):
    status_code = 431
    code = ErrorCode.REQUEST_HEADERS_TOO_LARGE


class RequestBodyTimeout(RequestError):
    status_code = 408
    code = ErrorCode.REQUEST_BODY_TIMEOUT


class LocalCapacityExhausted(RequestError):
    """Local replicas stayed saturated until the request's deadline and it could not burst."""

    status_code = 429
    error_type = "rate_limit_error"
    code = ErrorCode.LOCAL_CAPACITY_EXHAUSTED

    def __init__(self, message: str, *, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class UpstreamError(RequestError):
    status_code = 502
    error_type = "upstream_error"
    code = ErrorCode.UPSTREAM_ERROR


class RequestTimeout(UpstreamError):
    status_code = 504
    code = ErrorCode.REQUEST_TIMEOUT


class TargetUnavailable(UpstreamError):
    status_code = 503
    code = ErrorCode.TARGET_UNAVAILABLE


class ProviderRejected(RequestError):
    """A cloud provider refused the request itself (HTTP 4xx other than 401/403/408/429).

    The provider's message is kept; so is its status when it is 400, 404 or 422 (anything
    else becomes 400).
    """

    status_code = 400
    code = ErrorCode.PROVIDER_REJECTED
    KEPT_STATUSES = (400, 404, 422)

    def __init__(
        self, message: str, *, status_code: int = 400, param: str | None = None, code: ErrorCode | None = None
    ) -> None:
        super().__init__(message, param=param, code=code)
        self.status_code = status_code if status_code in self.KEPT_STATUSES else 400


class ProviderContextExceeded(ProviderRejected):
    """A cloud provider answered that the prompt does not fit its context window (OpenAI's 400
    `context_length_exceeded`, the Messages API's 400 "prompt is too long"): a fact about the
    target, not the request, so the dispatcher fails over to a target with a larger window."""

    code = ErrorCode.CONTEXT_LENGTH_EXCEEDED

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message, status_code=400, param=param, code=ErrorCode.CONTEXT_LENGTH_EXCEEDED)


class ProviderRateLimited(TargetUnavailable):
    """A cloud provider answered 429; `retry_after_s` is its Retry-After when it sent one."""

    status_code = 429
    code = ErrorCode.PROVIDER_RATE_LIMITED

    def __init__(
        self,
        message: str,
        *,
        retry_after_s: float | None = None,
        param: str | None = None,
        code: ErrorCode | None = None,
    ) -> None:
        super().__init__(message, param=param, code=code)
        self.retry_after_s = retry_after_s


class ProviderOverloaded(TargetUnavailable):
    """A cloud provider is overloaded for all its users (the Messages API's HTTP 529): not our
    quota and not a broken target; `retry_after_s` is its Retry-After when it sent one."""

    code = ErrorCode.PROVIDER_OVERLOADED

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class NoCapableModel(RequestError):
    """No configured target satisfies the request's contract (NO_CAPABLE_MODEL).

    `reasons` holds one `{"target", "filter", "reason"}` per removed candidate: target ids and
    reasons only, never base URLs or keys.
    """

    status_code = 422
    code = ErrorCode.NO_CAPABLE_MODEL

    def __init__(self, message: str, *, reasons: list[dict[str, Any]], param: str | None = None) -> None:
        super().__init__(message, param=param)
        self.reasons = reasons

    def to_openai(self) -> dict[str, Any]:
        body = super().to_openai()
        body["error"]["reasons"] = self.reasons
        return body


class NoTargetFitsContext(NoCapableModel):
    """Every candidate was removed by the context filter only: the request is too long for all of
    them. Answered as OpenAI does (400 context_length_exceeded), with the same `reasons`."""

    status_code = 400
    code = ErrorCode.CONTEXT_LENGTH_EXCEEDED


class CarriedContextRestricted(NoCapableModel):
    """A turn of a session whose carried context (anchor, summaries, stored history) may go only to
    targets none of which can serve the turn: refused rather than sent elsewhere or dropped. The
    message names the turns the constraints came from (router/sessions/carried.py)."""

    code = ErrorCode.CARRIED_CONTEXT_RESTRICTED


class ContractViolation(UpstreamError):
    """An L1 answer failed its output contract (JSON Schema, tool arguments) and no further
    candidate could be tried; `errors` holds the (bounded) validation errors."""

    code = ErrorCode.CONTRACT_VIOLATION
    usage: tuple[int, int] = (0, 0)  # prompt and completion tokens the violating answer spent

    def __init__(self, message: str, *, errors: list[str], param: str | None = None) -> None:
        super().__init__(message, param=param)
        self.errors = errors

    def to_openai(self) -> dict[str, Any]:
        body = super().to_openai()
        body["error"]["errors"] = self.errors
        return body


class DryRunFailed(RequestError):
    """An operator's switch refused: the standby failed its dry-run (no answer, or the scenario's contract broken)."""

    status_code = 409
    code = ErrorCode.DRY_RUN_FAILED


class NonCoreShed(TargetUnavailable):
    """A non-core request shed under shortage so that core requests keep the capacity (router/resilience/tiers.py)."""

    code = ErrorCode.NON_CORE_SHED
    degraded = "shed"  # the x-spillover-degraded value of its answer

    def __init__(self, message: str, *, retry_after_s: float = 5.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class TicketNotFound(NotFound):
    code = ErrorCode.TICKET_NOT_FOUND


class TicketAnswerDropped(UpstreamError):
    code = ErrorCode.TICKET_ANSWER_DROPPED
