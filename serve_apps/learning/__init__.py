"""What a gateway replica learns and records: the learning state (quality book, feedback, request
typing), its routes, decision records over HTTP and the decision log's file.

    state.py            Learning: the quality book, the feedback store, the request typer
    routes.py           `POST /v1/spillover/feedback`, `GET /v1/spillover/quality`
    decision_routes.py  decision records over HTTP, and whose they are
    decision_log.py     the decision log's file sink (`gateway.decisions_log`)
    shared_records.py   decision records and feedback through the shared store: every replica answers
    pooled_evidence.py  every replica learns from every replica's traffic, through the store's evidence log
    evidence_events.py  the events that log carries, and how one read back is checked
"""

# The modules of this wing the rest of serve_apps/ may import: its doors (tests/unit/test_wing_doors.py).
DOORS: tuple[str, ...] = (
    "decision_log",
    "decision_routes",
    "evidence_events",
    "pooled_evidence",
    "routes",
    "shared_records",
    "state",
)
