"""Degradation tiers: what a request of a core or a non-core scenario gets when targets are short.

A scenario's `priority` (router/routing/policy.py) says whether its requests are core (the business stops
without them) or non-core (they can wait or be dropped). Under shortage — every capable target down,
or the local model saturated with nowhere to burst — non-core requests give way first:

    priority   streamed   tickets on   shortage outcome
    core       any        any          fail as before (503 target_unavailable, 429 wait timeout, ...)
    non_core   no         yes          defer: 202 with a ticket, answered later (GET the ticket)
    non_core   yes / any  no / full    shed: 503 non_core_shed with Retry-After (the slot goes to core)

A non-core request never waits in the admission room while local capacity is short: it is deferred
(or shed) at once, so the waiting room holds core requests. Pure.
"""

from __future__ import annotations

from typing import Literal

from router.request.contract import RequestContract
from router.routing.policy import Policy

Priority = Literal["core", "non_core"]
Outcome = Literal["fail", "defer", "shed"]


def priority_of(policy: Policy, contract: RequestContract) -> Priority:
    scenario = policy.scenarios.get(contract.scenario)
    return scenario.priority if scenario is not None else "core"


def under_shortage(priority: Priority, *, streamed: bool, can_defer: bool) -> Outcome:
    if priority == "core":
        return "fail"
    return "defer" if can_defer and not streamed else "shed"
