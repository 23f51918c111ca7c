"""The operator's traffic controls on a gateway replica: drains, pins, graded switches and their shared
board; the live health scores and the weight they route by; the standby's dry-run; degradation tiers
and deferred requests' tickets.

    controls.py        Traffic: one replica's side of the controls and switches
    board.py           TrafficBoard: the operator's document, a named Ray actor
    routes.py          the operator traffic routes and the tickets' route
    wiring.py          the controls wired into a gateway replica
    metrics.py         the traffic controls' metrics
    live_scores.py     live health scores per target and scenario, measured latency
    weight_routing.py  the live routing weight applied to a request's candidates
    dry_run.py         the standby's dry-run before a switch
    deferral.py        degradation tiers: non-core requests deferred (tickets) or shed
    shared_tickets.py  tickets through the shared store: pollable through every replica
"""

# The modules of this wing the rest of serve_apps/ may import: its doors (tests/unit/test_wing_doors.py).
DOORS: tuple[str, ...] = ("board", "controls", "routes", "shared_tickets", "wiring")
