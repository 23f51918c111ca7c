"""The carried-state rule: what a session carries between turns keeps the constraints of the turns it came from.

Pure. Everything the gateway carries from one turn of a session to the next holds the client's text
of earlier turns: the state anchor (router/sessions/anchor.py: the first user turn, names and numbers), the
summaries of older turns (router/sessions/summary_cache.py) and, with `sessions.store`, the stored history
(router/sessions/history.py). Each is stored with a `Label`, the strictest constraints of the turns it came
from, and which turn set each of them:

    level      the strictest level of those turns (L1 strictest): context from an L1 turn goes only
               to on_prem / no_retention targets (L1's data policy), whatever level a later turn asks
    residency  the narrowest residency (local_only wins over anything, region lists intersect)
    providers  the intersection of their x-spillover-providers lists (None: any provider)
    targets    every scenario `allowed_targets` list they ran under that is not "*": a target must
               match one pattern of each
    tenant     whose turns they are (stores are keyed by tenant; a label of another tenant is never used)

A turn that names its session runs under its own contract joined with its session's label
(`RequestContract.carried`, set by serve_apps/sessions/turns.py): the `carried` filter
(router/routing/filters.py) removes every target the label does not admit, so the turn stays on a target
that may hold the context; when no target that may hold it can serve the turn, the request is
refused with 422 `carried_context_restricted`, whose message names the turn each constraint came
from (`restricted`). Context is never dropped silently and never sent where its turns could not go.
The level the answer itself is checked at stays the turn's own: a label says where the context may
go, not how this answer is validated. A label only gets stricter while its session lives (every
store joins it, never replaces it); a client that wants a turn free of it sends that turn without
naming the session: a new conversation, carrying nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from router.errors import CarriedContextRestricted, NoCapableModel
from router.headers import SESSION
from router.request.contract_headers import Residency, narrow_residency
from router.routing.policy import LEVELS, Level

if TYPE_CHECKING:
    from router.request.contract import RequestContract

DIMENSIONS = ("level", "residency", "providers", "targets")
MESSAGE_CHARS = 1000


@dataclass(frozen=True)
class Origin:
    """The turn a constraint came from."""

    request_id: str
    scenario: str
    turn: int | None = None  # the session's turn count when known (the pin table counts them)

    def describe(self) -> str:
        turn = f"turn {self.turn}" if self.turn is not None else "an earlier turn"
        return f"{turn} (request {self.request_id}, scenario {self.scenario!r})"

    def to_json(self) -> dict[str, Any]:
        return {"turn": self.turn, "request_id": self.request_id, "scenario": self.scenario}


UNKNOWN_ORIGIN = Origin("unknown", "unknown")


def _stricter(a: Level, b: Level) -> bool:
    """Whether level `a` is stricter than `b`."""
    return LEVELS.index(a) < LEVELS.index(b)


@dataclass(frozen=True)
class Label:
    tenant: str | None = None
    level: Level = "L3"
    residency: Residency = "any"
    providers: frozenset[str] | None = None
    targets: tuple[tuple[str, ...], ...] = ()
    origins: tuple[tuple[str, Origin], ...] = ()  # dimension -> the turn that set its value

    def origin(self, dimension: str) -> Origin:
        return next((o for d, o in self.origins if d == dimension), UNKNOWN_ORIGIN)

    @property
    def restrictive(self) -> bool:
        """Whether it keeps the context off any target (L2 and L3 have the same data policy)."""
        return self.level == "L1" or self.residency != "any" or self.providers is not None or bool(self.targets)

    def join(self, newer: Label) -> Label:
        """The strictest of both (`newer`'s origins for what it made stricter, this one's otherwise)."""
        origins: dict[str, Origin] = dict(self.origins)

        def took(dimension: str, from_newer: bool) -> None:
            if (from_newer or dimension not in origins) and dimension in dict(newer.origins):
                origins[dimension] = newer.origin(dimension)

        level = newer.level if _stricter(newer.level, self.level) else self.level
        took("level", level != self.level)
        residency = narrow_residency(self.residency, newer.residency)
        took("residency", residency != self.residency)
        providers = _intersect(self.providers, newer.providers)
        took("providers", providers != self.providers)
        targets = self.targets + tuple(g for g in newer.targets if g not in self.targets)
        took("targets", targets != self.targets)
        kept = tuple((d, origins[d]) for d in DIMENSIONS if d in origins)
        return Label(self.tenant, level, residency, providers, targets, kept)

    def constraints(self) -> list[str]:
        """Its restrictive constraints, each with the turn it came from (for messages)."""
        found: list[tuple[str, str]] = []
        if self.residency == "local_only":
            found.append(("residency local_only", "residency"))
        elif self.residency != "any":
            found.append((f"residency {', '.join(sorted(self.residency)) or '(no region)'}", "residency"))
        if self.level == "L1":
            found.append(("level L1 (on_prem or no_retention targets only)", "level"))
        if self.providers is not None:
            found.append((f"providers {', '.join(sorted(self.providers)) or '(none)'}", "providers"))
        found += [(f"allowed_targets {', '.join(g)}", "targets") for g in self.targets]
        return [f"{text} from {self.origin(dim).describe()}" for text, dim in found]

    def to_json(self) -> dict[str, Any]:
        """JSON-safe, as the stores keep it and decision records show it."""
        residency = self.residency if isinstance(self.residency, str) else sorted(self.residency)
        return {
            "tenant": self.tenant,
            "level": self.level,
            "residency": residency,
            "providers": None if self.providers is None else sorted(self.providers),
            "targets": [list(g) for g in self.targets],
            "from": {d: o.to_json() for d, o in self.origins},
        }


STRICTEST = Label(level="L1", residency="local_only")  # what a label that cannot be read is taken for


def _intersect(a: frozenset[str] | None, b: frozenset[str] | None) -> frozenset[str] | None:
    if a is None:
        return b
    return a if b is None else a & b


def _strings(value: Any) -> frozenset[str] | None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError("not a list of strings")
    return frozenset(value)


def _origin(value: Any) -> Origin:
    if not isinstance(value, Mapping):
        raise ValueError("not an origin")
    turn = value.get("turn")
    return Origin(str(value.get("request_id")), str(value.get("scenario")), turn if isinstance(turn, int) else None)


def from_json(value: Any, tenant: str | None) -> Label:
    """A stored label; one that cannot be read is taken as the strictest (of `tenant`): never looser."""
    try:
        if not isinstance(value, Mapping) or value.get("level") not in LEVELS:
            raise ValueError("not a label")
        if not isinstance(value.get("tenant"), str | None):
            raise ValueError("not a tenant")
        raw = value.get("residency")
        residency: Residency = raw if raw in ("any", "local_only") else _strings(raw)  # type: ignore[assignment]
        providers = None if value.get("providers") is None else _strings(value["providers"])
        targets = tuple(tuple(sorted(_strings(g) or ())) for g in value.get("targets") or [])
        origins = value.get("from") or {}
        kept = tuple((d, _origin(origins[d])) for d in DIMENSIONS if d in origins)
        return Label(value.get("tenant"), value["level"], residency, providers, targets, kept)
    except (ValueError, TypeError, KeyError, AttributeError):
        unknown = (("level", UNKNOWN_ORIGIN), ("residency", UNKNOWN_ORIGIN))
        return Label(tenant, STRICTEST.level, STRICTEST.residency, origins=unknown)


def label_of(contract: RequestContract, origin: Origin) -> Label:
    """The constraints of one turn's own contract (what its context will carry)."""
    groups = () if "*" in contract.allowed_target_patterns else (tuple(sorted(contract.allowed_target_patterns)),)
    level, residency, providers = contract.level, contract.residency, contract.allowed_providers
    set_by_it = (
        ("level", level != "L3"),
        ("residency", residency != "any"),
        ("providers", providers is not None),
        ("targets", bool(groups)),
    )
    origins = tuple((d, origin) for d, on in set_by_it if on)
    return Label(contract.tenant, level, residency, providers, groups, origins)


def effective_label(contract: RequestContract, origin: Origin) -> Label:
    """The label of what a turn leaves behind: its own constraints joined with what it carried."""
    own = label_of(contract, origin)
    return own if contract.carried is None else contract.carried.join(own)


def restricted(label: Label, error: NoCapableModel) -> CarriedContextRestricted:
    """The refusal of a turn no target that may receive its carried context can serve (`error`: the
    pipeline's, whose reasons name each target's first failing filter, `carried` among them)."""
    others = [r for r in error.reasons if r.get("filter") != "carried"]
    kept_off = len(error.reasons) - len(others)
    why = "; ".join(f"{r.get('target')}: {r.get('reason')}" for r in others[:4]) or "none is left"
    message = (
        f"this session carries context from earlier turns that may go only where they could "
        f"({'; '.join(label.constraints())}): {kept_off} target(s) may not receive it, and the others cannot "
        f"serve this turn ({why}). Send the turn without {SESSION} (or metadata.session_id) to start a new "
        "conversation that carries none of it"
    )
    return CarriedContextRestricted(message[:MESSAGE_CHARS], reasons=error.reasons)
