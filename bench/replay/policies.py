"""The routing policies a replay can compare on one running gateway, as the request headers that select them.

    shipped   no header: the gateway as it is configured (its watermarks, limits and burst rules); run the
              replay once per gateway configuration and name each run (`--label`)
    local     `x-spillover-residency: local_only`: every request stays local (bursting off), waiting for
              local room until its deadline
    cloud     `x-spillover-residency: <cloud region>`: every request goes to the cloud providers of that region

`deadline` adds `x-spillover-deadline-ms` = the SLO to every request, so the gateway knows by when each must
finish (router/request/contract_headers.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from router import headers as hdr

POLICIES = ("shipped", "local", "cloud")
DESCRIPTIONS = {
    "shipped": "the gateway as configured",
    "local": "every request local_only",
    "cloud": "every request to the cloud region",
}


@dataclass(frozen=True)
class Policy:
    name: str  # the built-in it runs
    label: str  # what the report calls it
    headers: dict[str, str]
    description: str


def policy(name: str, *, cloud_region: str, label: str | None = None, deadline_ms: int | None = None) -> Policy:
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}: use some of {', '.join(POLICIES)}")
    headers: dict[str, str] = {}
    if name == "local":
        headers[hdr.RESIDENCY] = "local_only"
    elif name == "cloud":
        headers[hdr.RESIDENCY] = cloud_region
    if deadline_ms is not None:
        headers[hdr.DEADLINE] = str(deadline_ms)
    description = DESCRIPTIONS[name] + (f" ({cloud_region})" if name == "cloud" else "")
    return Policy(name, label or name, headers, description)


def slug(label: str) -> str:
    """A label as it goes into file names and request ids."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", label).strip("-")[:40] or "policy"
