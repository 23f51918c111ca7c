"""One request's dispatch: plan it, wait for local room if it must, run the attempts, record why; and the
admission limit with the live workload mix it reads.

    dispatcher.py    Dispatcher: the plan, the wait, the attempts' loop and its doors
    interfaces.py    what it returns, whom it tells, what the HTTP layer calls
    parts.py         DispatchParts: what a dispatcher shares with the rest of its gateway
    walk.py          one request's walk over its candidates: the trail, notes, refusals
    calls.py         how a target is reached: a local model through its backend, a cloud provider
    streams.py       the stream a client reads once a target's first byte came
    record.py        the decision record of the plan that was executed
    admission.py     the admission limit, in-flight counts and the waiting room
    admission_plans.py  the calibrated models' admission plans, made off the request path
    workload_mix.py  the live workload mix the admission limit reads
    reservations.py  Reservations: admitted requests as leases on each model's limit in the shared store
"""

# The modules of this wing the rest of serve_apps/ may import: its doors (tests/unit/test_wing_doors.py).
DOORS: tuple[str, ...] = ("admission_plans", "dispatcher", "interfaces", "parts", "reservations")
