"""When targets fail, on a gateway replica: the resilience state every attempt's outcome updates, the
evidence the probes add, the start-up golden check, the context windows learnt from answers, the
breakers shared between replicas and the operator's view and reset.

    state.py             Resilience: breakers, health, retry budget, quotas, the spend ledger
    prober.py            liveness, latency and correctness probes
    golden_gate.py       no routing to a local model before it answered its golden prompt right
    learned_windows.py   targets' real context windows, learnt from their answers
    breaker_exchange.py  BreakerExchange: open breakers shared by the gateway replicas (a named Ray actor)
    routes.py            the operator routes of the resilience state (view, reset)
"""

# The modules of this wing the rest of serve_apps/ may import: its doors (tests/unit/test_wing_doors.py).
DOORS: tuple[str, ...] = ("breaker_exchange", "golden_gate", "prober", "routes", "state")
