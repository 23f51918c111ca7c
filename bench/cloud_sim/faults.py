"""Which fault (if any) the cloud simulator injects into one request.

`decide_fault` makes exactly one draw from the injected `random.Random` per admitted request
and maps it onto consecutive bands, one per fault rate, in `FAULT_BANDS` order; the same seed
and the same request sequence therefore give the same faults. What each fault looks like on
the wire:

    error_5xx      500, 502 or 503 (a second draw) with an OpenAI error body; with `api: anthropic`
                   500 api_error or 529 overloaded_error in the Messages API's error shape
    rate_limit     429 with `Retry-After` (whole seconds) and `retry-after-ms`
    timeout        no byte for `hang_s` seconds (or until the client goes away), then 504
    reset          the TCP connection is aborted (RST) before any response byte: what a client
                   sees when a load balancer or a crashed process drops it
    midstream_cut  200, part of the body or SSE stream, then the connection drops
    malformed      200 whose JSON body or SSE `data:` payload is not valid JSON (a stream: its first
                   token event is replaced)
    schema_invalid 200, well-formed, but the answer to a `response_format: json_schema` request
                   is JSON that does not satisfy the schema (output-contract tests); other
                   requests are answered normally
    tool_args_invalid 200, well-formed, but a tool call's arguments break the tool's declared
                   `parameters`: every declared property gets a value of the wrong type (a string
                   where the schema says integer, ...) and an undeclared `cloud_sim` key is added
                   (output-contract tests of tool calls, JSON and stream, both APIs); answers
                   without a tool call are normal
    malformed_event a stream gets one event that is not JSON between two token events (nothing lost);
                   other requests are answered normally
    no_done        a stream ends after its finish_reason and usage without `[DONE]` (the Messages API:
                   without message_stop); other requests are answered normally

What each does to a stream: stream_faults.py. Request checks that are settings, not draws (the
context window, an assistant prefill refused): prefill.py.
"""

from __future__ import annotations

import random
from enum import StrEnum

from bench.cloud_sim.settings import SimSettings


class Fault(StrEnum):
    NONE = "none"
    ERROR_5XX = "error_5xx"
    RATE_LIMIT = "rate_limit"
    TIMEOUT = "timeout"
    RESET = "reset"
    MIDSTREAM_CUT = "midstream_cut"
    MALFORMED = "malformed"
    SCHEMA_INVALID = "schema_invalid"
    TOOL_ARGS_INVALID = "tool_args_invalid"
    MALFORMED_EVENT = "malformed_event"
    NO_DONE = "no_done"


FAULT_BANDS: tuple[tuple[Fault, str], ...] = (
    (Fault.ERROR_5XX, "error_5xx_rate"),
    (Fault.RATE_LIMIT, "rate_limit_rate"),
    (Fault.TIMEOUT, "timeout_rate"),
    (Fault.RESET, "reset_rate"),
    (Fault.MIDSTREAM_CUT, "midstream_cut_rate"),
    (Fault.MALFORMED, "malformed_rate"),
    (Fault.SCHEMA_INVALID, "schema_invalid_rate"),
    (Fault.TOOL_ARGS_INVALID, "tool_args_invalid_rate"),
    (Fault.MALFORMED_EVENT, "malformed_event_rate"),
    (Fault.NO_DONE, "no_done_rate"),
)

SERVER_ERROR_STATUSES = (500, 502, 503)


class SimulatedCut(Exception):
    """Raised inside a response after its first bytes went out: the server drops the connection."""


def decide_fault(settings: SimSettings, rng: random.Random) -> Fault:
    draw = rng.random()
    edge = 0.0
    for fault, field in FAULT_BANDS:
        edge += getattr(settings, field)
        if draw < edge:
            return fault
    return Fault.NONE
