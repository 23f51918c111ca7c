"""Routes of the learning state (serve_apps/learning/state.py).

    POST /v1/spillover/feedback  {request_id, outcome: success|failure, label?, source}
                                 a late verdict on an answered request (router/learning/feedback.py): any
                                 tenant, on its own requests only — another tenant's request id gets
                                 the same 404 as an unknown one; 200 says what it changed (quality,
                                 typing examples) and for whom (`scope`: own, everyone); 400
                                 invalid_feedback, 409 feedback_exists (one per request and source
                                 kind), 429 feedback_rate_limited (per tenant, before the body is read)
    GET  /v1/spillover/quality   learned quality per target and bucket (router/learning/quality.py); with
                                 gateway auth only an `admin` tenant (403 otherwise)

Feedback finds the request's decision record on this gateway replica (the last
`gateway.decisions_kept`), else in the shared store (for `gateway.decisions_ttl_s`), so it can be sent
to any replica; one report per request and source kind holds across replicas
(serve_apps/learning/shared_records.py).
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from router.error_codes import ErrorCode
from router.errors import FeedbackExists, NotFound
from router.learning.decision import DecisionStore
from router.learning.feedback import SOURCE_KINDS, parse_feedback, source_kind
from serve_apps.http.edge import HttpEdge
from serve_apps.learning.decision_routes import owner_of
from serve_apps.learning.shared_records import SharedDecisions, find_record
from serve_apps.learning.state import Learning


class LearningRoutes:
    def __init__(self, learning: Learning, decisions: DecisionStore) -> None:
        self.learning = learning
        self.derive = learning.derive
        self._decisions = decisions

    def routes(self, edge: HttpEdge) -> list[Route]:
        async def feedback(request: Request) -> Response:
            tenant = await edge.tenant(request)  # before the body is read
            owner = owner_of(tenant)
            self.learning.admit_feedback(owner)  # every post costs a token, a refused one too
            given = parse_feedback(await request.body())  # bounded by BodyLimit, then by parse_feedback
            record = await find_record(self._decisions, given.request_id, owner)
            if record is None:
                shown = given.request_id[:128]
                raise NotFound(f"no decision record for request {shown!r} (kept: your recent ones)")
            if isinstance(self._decisions, SharedDecisions):
                kind = source_kind(given.source)
                said = json.dumps({"outcome": given.outcome, "source": given.source}).encode()
                if not await self._decisions.claim_feedback(given.request_id, owner, kind, said):
                    raise FeedbackExists(
                        f"feedback of source kind {kind!r} on request {given.request_id[:128]!r} is already "
                        f"recorded (one verdict per request and kind: {', '.join((*SOURCE_KINDS, 'other'))})"
                    )
            shared = tenant is None or tenant.shares_feedback  # without auth every request is one tenant's
            applied = self.learning.report(given, record, owner, shared=shared)
            answer: dict[str, Any] = {"request_id": given.request_id, "outcome": given.outcome, "source": given.source}
            answer |= {"label": given.label, "applied": applied, "scope": "everyone" if shared else "own"}
            return JSONResponse(answer, headers=edge.headers_for(request))

        async def quality(request: Request) -> Response:
            await edge.admin(request)
            book = self.learning.quality
            if book is None:
                raise NotFound("learning.quality.enabled is false", code=ErrorCode.QUALITY_DISABLED)
            return JSONResponse(book.view(), headers=edge.headers_for(request))

        return [
            Route("/v1/spillover/feedback", edge.endpoint(feedback), methods=["POST"]),
            Route("/v1/spillover/quality", edge.endpoint(quality), methods=["GET"]),
        ]
