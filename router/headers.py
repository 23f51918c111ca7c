"""Every HTTP header name the gateway reads or writes, defined once (docs/http-api.md documents them)."""

from __future__ import annotations

# -- request: identity and replays
REQUEST_ID = "x-request-id"  # the client's id (kept, or replaced when not 1-128 visible ASCII / taken)
IDEMPOTENCY_KEY = "idempotency-key"
AUTHORIZATION = "authorization"

# -- request: contract headers (they can only narrow what the scenario allows)
SCENARIO = "x-business-scenario"
LEVEL = "x-spillover-level"
RESIDENCY = "x-spillover-residency"
PROVIDERS = "x-spillover-providers"
MAX_COST = "x-spillover-max-cost-usd"
DEADLINE = "x-spillover-deadline-ms"

# -- request: conversation continuity (router/sessions/sessions.py)
SESSION = "x-spillover-session"  # names the conversation a request belongs to

# -- response
ROUTE = "x-spillover-route"  # local | cloud
TARGET = "x-spillover-target"  # local:<alias> | cloud:<provider>
REASON = "x-spillover-reason"
USED_REQUEST_ID = "x-spillover-request-id"  # the id a request ran under when it is not the x-request-id it sent
CONTRACT = "x-spillover-contract"  # repaired | the L2 violation summary
IDEMPOTENT_REPLAY = "x-spillover-idempotent-replay"
DEGRADED = "x-spillover-degraded"  # deferred (202 + ticket) | shed | cached: the answer came from a degraded mode
TICKET = "x-spillover-ticket"  # the ticket of a deferred request (GET /v1/spillover/tickets/{id})
TRAFFIC = "x-spillover-traffic"  # the graded switch step a request ran under

# -- gateway -> provider
ATTEMPT = "x-spillover-attempt"  # which attempt of the request this is (the only gateway header forwarded)

SPILLOVER_PREFIX = "x-spillover-"
CONTRACT_HEADERS = (SCENARIO, LEVEL, RESIDENCY, PROVIDERS, MAX_COST, DEADLINE)
