"""The gateway's OpenAPI 3.0 document, served at `GET /openapi.json`.

Written by hand (the gateway is a plain Starlette app): the OpenAI-compatible routes with the
fields the gateway itself reads, the spillover routes, and the error shape every failure uses.
Every route declares the request headers the gateway reads, so the fuzzer sends hostile values in
them too. schemathesis runs against it in the tests (tests/unit/test_openapi_fuzz.py): no 5xx, no
hang, with auth off and on.
"""

from __future__ import annotations

from typing import Any

from router import headers as hdr

ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": "string", "nullable": True},
                "code": {"type": "string", "nullable": True},
            },
        }
    },
}

MESSAGE = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "role": {"type": "string", "enum": ["system", "user", "assistant", "tool"]},
        "content": {"type": "string", "nullable": True},
    },
}

COMMON_BODY = {
    "model": {"type": "string"},
    "stream": {"type": "boolean"},
    "max_tokens": {"type": "integer", "minimum": 1},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
}

CHAT_BODY = {
    "type": "object",
    "required": ["model", "messages"],
    "properties": {
        **COMMON_BODY,
        "messages": {"type": "array", "minItems": 1, "items": MESSAGE},
        "response_format": {"type": "object"},
        "tools": {"type": "array", "items": {"type": "object"}},
    },
}

COMPLETION_BODY = {
    "type": "object",
    "required": ["model", "prompt"],
    "properties": {**COMMON_BODY, "prompt": {"type": "string", "minLength": 1}},
}


def _header(name: str) -> dict[str, Any]:
    return {"name": name, "in": "header", "required": False, "schema": {"type": "string"}}


COMMON_HEADERS = [_header(hdr.REQUEST_ID), _header(hdr.AUTHORIZATION)]
SPILLOVER_HEADERS = [
    *COMMON_HEADERS,
    _header(hdr.IDEMPOTENCY_KEY),
    {"name": hdr.RESIDENCY, "in": "header", "required": False, "schema": {"type": "string"}},
    {"name": hdr.DEADLINE, "in": "header", "required": False, "schema": {"type": "string"}},
    {"name": hdr.LEVEL, "in": "header", "required": False, "schema": {"type": "string"}},
    {"name": hdr.PROVIDERS, "in": "header", "required": False, "schema": {"type": "string"}},
    {"name": hdr.MAX_COST, "in": "header", "required": False, "schema": {"type": "string"}},
    {"name": hdr.SCENARIO, "in": "header", "required": False, "schema": {"type": "string"}},
    {"name": hdr.SESSION, "in": "header", "required": False, "schema": {"type": "string"}},
]
_OPEN = {"parameters": COMMON_HEADERS}


def _errors(*codes: int) -> dict[str, Any]:
    json_error = {"content": {"application/json": {"schema": ERROR}}}
    return {str(code): {"description": "error in the OpenAI shape", **json_error} for code in codes}


def _json(description: str) -> dict[str, Any]:
    return {"200": {"description": description, "content": {"application/json": {"schema": {"type": "object"}}}}}


def _generation(summary: str, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "parameters": SPILLOVER_HEADERS,
            "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
            "responses": {
                "200": {
                    "description": "the completion (JSON), or SSE events ending with data: [DONE]",
                    "content": {"application/json": {"schema": {"type": "object"}}, "text/event-stream": {}},
                },
                **_errors(400, 401, 404, 409, 413, 422, 429, 502, 503, 504),
            },
        }
    }


TRAFFIC_BODY = {
    "type": "object",
    "required": ["action"],
    "properties": {
        "action": {"type": "string", "enum": ["drain", "undrain", "pin", "unpin", "switch", "rollback", "clear"]},
        "model": {"type": "string"},
        "scenario": {"type": "string"},
        "target": {"type": "string"},
        "primary": {"type": "string"},
        "standby": {"type": "string"},
        "reason": {"type": "string"},
        "step_s": {"type": "number"},
        "min_requests": {"type": "integer"},
        "dry_run": {"type": "object"},
    },
}
TRAFFIC_PATHS: dict[str, Any] = {
    "/v1/spillover/traffic": {
        "get": {
            "summary": "the operator's traffic controls and this replica's switches (admin)",
            **_OPEN,
            "responses": {**_json("traffic state"), **_errors(401, 403, 429)},
        },
        "post": {
            "summary": "one traffic command: drain, pin, switch (after a dry-run), rollback, clear (admin)",
            "parameters": COMMON_HEADERS,
            "requestBody": {"required": True, "content": {"application/json": {"schema": TRAFFIC_BODY}}},
            "responses": {**_json("what changed and the state"), **_errors(400, 401, 403, 409, 413, 429)},
        },
    },
    "/v1/spillover/tickets/{ticket}": {
        "get": {
            "summary": "a deferred request's answer (202 while pending; the caller's own)",
            "parameters": [
                {"name": "ticket", "in": "path", "required": True, "schema": {"type": "string"}},
                *COMMON_HEADERS,
            ],
            "responses": {**_json("the answer"), **_errors(401, 404, 429)},
        }
    },
}


def openapi_document() -> dict[str, Any]:
    return {
        "openapi": "3.0.3",
        "info": {"title": "spillover gateway", "version": "1"},
        "paths": {
            "/v1/chat/completions": _generation("OpenAI chat completions", CHAT_BODY),
            "/v1/completions": _generation("OpenAI text completions", COMPLETION_BODY),
            "/v1/models": {
                "get": {"summary": "configured models", **_OPEN, "responses": {**_json("models"), **_errors(401, 429)}}
            },
            "/healthz": {"get": {"summary": "liveness", **_OPEN, "responses": _json("alive")}},
            "/readyz": {"get": {"summary": "readiness", **_OPEN, "responses": {**_json("ready"), **_errors(503)}}},
            "/v1/spillover/cluster": {
                "get": {
                    "summary": "the router's ClusterSnapshot (an admin tenant when auth is on)",
                    **_OPEN,
                    "responses": {**_json("snapshot"), **_errors(401, 403, 404, 429)},
                }
            },
            "/v1/spillover/decisions/{request_id}": {
                "get": {
                    "summary": "one request's decision record (the caller's own)",
                    "parameters": [
                        {"name": "request_id", "in": "path", "required": True, "schema": {"type": "string"}},
                        *COMMON_HEADERS,
                    ],
                    "responses": {**_json("decision record"), **_errors(401, 404, 429)},
                }
            },
            **TRAFFIC_PATHS,
            "/v1/spillover/feedback": {
                "post": {
                    "summary": "a verdict on one of the caller's answered requests (serve_apps/learning/routes.py)",
                    **_OPEN,
                    "requestBody": {"required": True, "content": {"application/json": {"schema": FEEDBACK_BODY}}},
                    "responses": {**_json("stored, and what it changed"), **_errors(400, 401, 404, 409, 413, 429)},
                }
            },
            "/v1/spillover/quality": {
                "get": {
                    "summary": "learned quality per target and bucket (an admin tenant when auth is on)",
                    **_OPEN,
                    "responses": {**_json("quality"), **_errors(401, 403, 404, 429)},
                }
            },
        },
    }


FEEDBACK_BODY = {
    "type": "object",
    "required": ["request_id", "outcome", "source"],
    "properties": {
        "request_id": {"type": "string"},
        "outcome": {"type": "string", "enum": ["success", "failure"]},
        "label": {"type": "string"},
        "source": {"type": "string"},
    },
}
