"""What a failed attempt was, and what the dispatcher may do about it.

Pure: no I/O, no clock. `classify` maps a `router.errors.RequestError` (as raised by the
provider adapter or the local engine path) to a `FailureClass`; `RETRY_TABLE` says, per
class, what the dispatcher may do next. Retry behaviour is this table, not keyword arguments
scattered over call sites.

    class           raised as (code)                          same  over  breaker  cools  black
    TRANSPORT       provider_unreachable, target_unavailable   yes   yes   yes      -      -
    TIMEOUT         provider_timeout, RequestTimeout,          -     yes   yes      -      -
                    replicas_stale (every local replica went
                    silent while we waited for the first byte),
                    replica_fault (every local replica left
                    routing meanwhile: numerics, stalled engine)
    RATE_LIMITED    ProviderRateLimited (429)                  -     yes   -        yes    -
    OVERLOADED      ProviderOverloaded (Anthropic's 529)       -     yes   -        yes    -
    SERVER          provider_error, provider_stream_error      yes   yes   yes      -      -
                    (an error event before any byte reached
                    the client), upstream_error, unknown
    PROTOCOL        provider_malformed, provider_reply_too_   -     yes   yes      -      -
                    large (past max_reply_bytes)
    CUT             provider_cut (non-streamed body only)      yes   yes   yes      -      -
    CONTRACT        ContractViolation                          -     yes   -        -      -
    CAPABILITY      ProviderContextExceeded (400 context_      -     yes   -        -      -
                    length_exceeded, Anthropic's "prompt is
                    too long")
    AUTH            provider_auth_failed (401/403 to OUR key)  -     yes   yes      -      yes
    NOT_CONFIGURED  provider_not_configured (key var unset)    -     yes   -        -      yes
    CLIENT          ProviderRejected, InvalidRequest,          -     -     -        -      -
                    ModelNotFound, NoCapableModel, any other
                    RequestError with status < 500

    same = retry the same target after a backoff    over = fail over to the next capable candidate
    breaker = a failure for the target's circuit breaker and health
    cools = a 429 cools the target's whole failure domain    black = target health goes black

Why the rows differ:

- TIMEOUT is not retried on the same target: waiting again on a hanging target burns the
  request's deadline; another candidate is the better use of the time left.
- RATE_LIMITED is not a breaker failure: the target is healthy, only busy. It cools the whole
  failure domain (one account's quota is shared by its models) instead.
- OVERLOADED is the provider short of capacity for all its users: like a 429 it says nothing
  about the target's health, so it cools the failure domain (for its Retry-After, else briefly)
  and the request fails over at once instead of waiting on the same target.
- SERVER holds `provider_stream_error` as well: a provider that sends an error event instead of its
  answer failed the way a 5xx does. The table is only asked before a stream's first byte reached the
  client (serve_apps/dispatch/dispatcher.py: nothing is re-sent after it), so a retry duplicates nothing.
- PROTOCOL is not retried on the same target: a target that answers garbage (or too much of it) tends
  to repeat it.
- CUT is only classified here for a non-streamed body, i.e. before the client received
  anything, so a retry cannot duplicate output the client already saw.
- CONTRACT is the model's answer breaking the request's output contract: the target works, so
  no breaker failure, but another candidate may well satisfy the contract.
- CAPABILITY is a provider saying the prompt does not fit the target's context window: a fact about
  the target (its real window is smaller than configured, or the provider counts tokens differently),
  not about the request, so the request moves to a target with a larger window and is never
  truncated; the target works, so no breaker failure.
- AUTH / NOT_CONFIGURED are our credential problems: the client's request is fine, so another
  provider may serve it, while this target goes black until an operator fixes the key.
- CLIENT errors (400/401/403/404/422 about the request itself) go back to the client: they
  would fail the same way everywhere.

Classification order: the leaf classes whose meaning is fixed by their type
(`ProviderRateLimited`, `ProviderOverloaded`, `RequestTimeout`, `ContractViolation`,
`ProviderContextExceeded`) first; then, for any other
`UpstreamError`, its `code` (`UPSTREAM_CODES`, keyed by `router.error_codes.ErrorCode`; an unknown
code, e.g. one quoted from an upstream's error event, is SERVER); then any other `RequestError` is
SERVER if its status is >= 500 and CLIENT otherwise. The code table is only consulted for
`UpstreamError`s, so a provider's own code carried by a `ProviderRejected` can never turn a
client error into a retryable one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from router.error_codes import ErrorCode
from router.errors import (
    ContractViolation,
    ProviderContextExceeded,
    ProviderOverloaded,
    ProviderRateLimited,
    RequestError,
    RequestTimeout,
    UpstreamError,
)


class FailureClass(StrEnum):
    """What went wrong in one attempt, at the granularity the retry policy cares about."""

    TRANSPORT = "transport"
    TIMEOUT = "timeout"
    RATE_LIMITED = "rate_limited"
    OVERLOADED = "overloaded"
    SERVER = "server"
    PROTOCOL = "protocol"
    CUT = "cut"
    CONTRACT = "contract"
    CAPABILITY = "capability"
    AUTH = "auth"
    NOT_CONFIGURED = "not_configured"
    CLIENT = "client"


@dataclass(frozen=True)
class Rule:
    """What the dispatcher may do after one failed attempt of a given class.

    `retry_same`: may try the same target again after a backoff.
    `fail_over`: may move on to the next capable candidate.
    `breaker_failure`: counts as a failure for the target's circuit breaker and health.
    `cools_domain`: a 429 that cools the target's whole failure domain.
    `marks_black`: a credential problem; the target's health goes black.
    """

    retry_same: bool = False
    fail_over: bool = False
    breaker_failure: bool = False
    cools_domain: bool = False
    marks_black: bool = False

    @property
    def retryable(self) -> bool:
        """True when any further attempt (same target or another) is allowed."""
        return self.retry_same or self.fail_over


RETRY_TABLE: Mapping[FailureClass, Rule] = MappingProxyType(
    {
        FailureClass.TRANSPORT: Rule(retry_same=True, fail_over=True, breaker_failure=True),
        FailureClass.TIMEOUT: Rule(fail_over=True, breaker_failure=True),
        FailureClass.RATE_LIMITED: Rule(fail_over=True, cools_domain=True),
        FailureClass.OVERLOADED: Rule(fail_over=True, cools_domain=True),
        FailureClass.SERVER: Rule(retry_same=True, fail_over=True, breaker_failure=True),
        FailureClass.PROTOCOL: Rule(fail_over=True, breaker_failure=True),
        FailureClass.CUT: Rule(retry_same=True, fail_over=True, breaker_failure=True),
        FailureClass.CONTRACT: Rule(fail_over=True),
        FailureClass.CAPABILITY: Rule(fail_over=True),
        FailureClass.AUTH: Rule(fail_over=True, breaker_failure=True, marks_black=True),
        FailureClass.NOT_CONFIGURED: Rule(fail_over=True, marks_black=True),
        FailureClass.CLIENT: Rule(),
    }
)

# `UpstreamError.code` -> class, for the codes the provider adapters and the local engine path
# raise (see serve_apps/providers/openai_compat.py). Immutable, so not module-level mutable state.
UPSTREAM_CODES: Mapping[ErrorCode, FailureClass] = MappingProxyType(
    {
        ErrorCode.PROVIDER_UNREACHABLE: FailureClass.TRANSPORT,
        ErrorCode.TARGET_UNAVAILABLE: FailureClass.TRANSPORT,
        ErrorCode.PROVIDER_TIMEOUT: FailureClass.TIMEOUT,
        ErrorCode.REQUEST_TIMEOUT: FailureClass.TIMEOUT,
        ErrorCode.REPLICAS_STALE: FailureClass.TIMEOUT,
        ErrorCode.REPLICA_FAULT: FailureClass.TIMEOUT,
        ErrorCode.PROVIDER_RATE_LIMITED: FailureClass.RATE_LIMITED,
        ErrorCode.PROVIDER_OVERLOADED: FailureClass.OVERLOADED,
        ErrorCode.PROVIDER_ERROR: FailureClass.SERVER,
        ErrorCode.PROVIDER_STREAM_ERROR: FailureClass.SERVER,
        ErrorCode.UPSTREAM_ERROR: FailureClass.SERVER,
        ErrorCode.PROVIDER_MALFORMED: FailureClass.PROTOCOL,
        ErrorCode.PROVIDER_REPLY_TOO_LARGE: FailureClass.PROTOCOL,
        ErrorCode.PROVIDER_CUT: FailureClass.CUT,
        ErrorCode.CONTRACT_VIOLATION: FailureClass.CONTRACT,
        ErrorCode.PROVIDER_AUTH_FAILED: FailureClass.AUTH,
        ErrorCode.PROVIDER_NOT_CONFIGURED: FailureClass.NOT_CONFIGURED,
    }
)


def classify(error: RequestError) -> FailureClass:
    """The failure class of one failed attempt (see the module docstring for the order)."""
    if isinstance(error, ProviderRateLimited):
        return FailureClass.RATE_LIMITED
    if isinstance(error, ProviderOverloaded):
        return FailureClass.OVERLOADED
    if isinstance(error, RequestTimeout):
        return FailureClass.TIMEOUT
    if isinstance(error, ContractViolation):
        return FailureClass.CONTRACT
    if isinstance(error, ProviderContextExceeded):
        return FailureClass.CAPABILITY
    if isinstance(error, UpstreamError):
        known = ErrorCode.of(error.code)
        return FailureClass.SERVER if known is None else UPSTREAM_CODES.get(known, FailureClass.SERVER)
    if error.status_code >= 500:
        return FailureClass.SERVER
    return FailureClass.CLIENT


def rule_for(error: RequestError) -> Rule:
    """The retry rule for one failed attempt: `RETRY_TABLE[classify(error)]`."""
    return RETRY_TABLE[classify(error)]
