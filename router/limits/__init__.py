"""Spend and rate limits: the monthly budget and per-request cost ceiling, per-provider RPM/TPM quotas
and the rate-limit headers that feed them, and a token bucket.

    budget.py        the monthly budget and the per-request cost ceiling
    quota.py         per-provider RPM / TPM quotas
    rate_headers.py  what a provider's rate-limit headers say is left
    rate_limit.py    a token bucket (per-replica request rates)
"""

# The modules of this wing the other wings of router/ may import: its doors (tests/unit/test_wing_doors.py).
DOORS: tuple[str, ...] = ("rate_limit", "budget")
