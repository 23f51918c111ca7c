"""The gateway's HTTP surface: an OpenAI-compatible Starlette app, the one place errors become answers,
what the edge refuses or cleans, and the limits where the bytes arrive.

    surface.py     GatewayHTTP: the routes over a `ModelBackend` and the injected dispatcher
    edge.py        the one error renderer and the one operator guard
    guards.py      body limit, header limits, request ids, error text scrubbing, the request timeout
    limits.py      `gateway.http_limits` in Serve's HTTP proxy (its uvicorn protocol and callback)
    direct.py      DirectListener: the replica's own listener on `gateway.direct_port`, without Serve's proxy
    openapi.py     the OpenAPI 3.0 document at `GET /openapi.json`
    readiness.py   `GET /readyz`
    model_card.py  a served model as `GET /v1/models` lists it
    idempotent.py  `Idempotency-Key` at the HTTP edge
"""

# The modules of this wing the rest of serve_apps/ may import: its doors (tests/unit/test_wing_doors.py).
DOORS: tuple[str, ...] = ("direct", "edge", "guards", "idempotent", "limits", "model_card", "surface")
