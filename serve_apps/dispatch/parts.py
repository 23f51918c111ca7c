"""What a `Dispatcher` (serve_apps/dispatch/dispatcher.py) shares with the rest of its gateway.

The gateway's composition (serve_apps/gateway_build.py) builds each part once and hands the same one
to every part that needs it: the registry of targets and routes (router/routing/capabilities.py) to the
dispatcher, the traffic controls and learning; the decision store to the dispatcher and the decision
and learning routes. A part left None is the dispatcher's own: a registry from its config and
providers, an empty decision store, no observer, resilience state of its own, no traffic controls,
sessions without a shared table, no learned quality, a schema-check pool of its own, admission plans made
when asked (the gateway makes them on a thread of their own).
"""

from __future__ import annotations

from dataclasses import dataclass

from router.learning.decision import DecisionStore
from router.learning.quality import QualityBook
from router.routing.capabilities import Registry
from serve_apps.dispatch.admission_plans import AdmissionPlans
from serve_apps.dispatch.interfaces import DispatchObserver
from serve_apps.dispatch.reservations import Reservations
from serve_apps.off_loop.check_pool import CheckPool
from serve_apps.resilience.state import Resilience
from serve_apps.sessions.turns import Sessions
from serve_apps.traffic.controls import Traffic


@dataclass(frozen=True)
class DispatchParts:
    registry: Registry | None = None
    decisions: DecisionStore | None = None  # the records (router/learning/decision.py)
    observer: DispatchObserver | None = None  # metrics, learning (serve_apps/learning/state.py)
    resilience: Resilience | None = None  # health, breakers, budget, quotas (serve_apps/resilience/state.py)
    traffic: Traffic | None = None  # operator drains / pins and graded switches (serve_apps/traffic/controls.py)
    sessions: Sessions | None = None  # pins, anchor, compression (serve_apps/sessions/turns.py)
    quality: QualityBook | None = None  # learned per-bucket quality for the quality scorer (router/learning/quality.py)
    checks: CheckPool | None = None  # output checks off the event loop (serve_apps/off_loop/check_pool.py)
    admission_plans: AdmissionPlans | None = None  # calibrated plans, made off the request path (admission_plans.py)
    reservations: Reservations | None = None  # admissions as leases in the shared store (reservations.py)
