"""Where a request goes: the routing plan, the filter → score → pick pipeline and its plugins, the
policy and capability registry, the cluster snapshot, replica saturation and watermarks, the burst
decision (local, cloud or wait) and the health-weighted split.

    plan.py          one request's plan: contract pipeline, then burst decision
    pipeline.py      the filter → score → pick framework
    plugins.py       the pipeline's plugin protocols and their views
    filters.py       hard filters
    scorers.py       scorers that rank the targets left
    policy.py        routing policy as data: scenarios and weights
    capabilities.py  what each target can do: the capability registry
    burst.py         the burst decision: local, cloud, or wait
    saturation.py    one saturation number per local replica
    snapshot.py      per-replica engine stats and the cluster snapshot
    watermarks.py    the pressure thresholds a replica is judged by
    weight_split.py  the share of new requests a degraded first choice keeps
"""

# The modules of this wing the other wings of router/ may import: its doors (tests/unit/test_wing_doors.py).
DOORS: tuple[str, ...] = ("capabilities", "pipeline", "plugins", "policy", "filters", "plan")
