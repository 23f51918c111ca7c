"""When targets fail: circuit breakers, the failure table, retries and backoff, the per-target health
machine with its evidence and score, stream continuation, the read-only answer cache and degradation
tiers.

    breaker.py          circuit breakers per target and failure domain
    failure.py          what a failed attempt was, what the dispatcher may do
    retry.py            backoff, retry budgets, the next-attempt decision
    next_step.py        where a request's walk over its candidates goes next
    health.py           the green / yellow / red / black health machine
    health_evidence.py  what a health machine has seen
    health_score.py     a health score from live traffic and its weight
    continuation.py     continuing a broken stream
    response_cache.py   read-only answers for when every target is down
    tiers.py            degradation tiers for core and non-core scenarios
"""

# The modules of this wing the other wings of router/ may import: its doors (tests/unit/test_wing_doors.py).
DOORS: tuple[str, ...] = ()
