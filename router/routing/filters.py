"""Hard filters: a target that fails one cannot serve the request, whatever its score.

Each returns None to keep the target or the reason it is removed; the reasons reach the client
in a NO_CAPABLE_MODEL body, so they name target ids, numbers and header names, never URLs or keys.
The pipeline stops at a target's first failing filter; the order puts the most fundamental
reason first:

    capabilities_known   a cloud entry configured as a bare model name has no capabilities
    allowed_targets      the scenario's glob patterns over target ids (fnmatch, case-sensitive)
    providers            x-spillover-providers; restricts cloud targets only (local is no provider)
    residency            local_only → local targets only; a region list → the target's region in it
                         (local targets carry the cluster's region, "local" unless configured)
    data_policy          L1 → on_prem or no_retention; L2 and L3 → any configured policy
    carried              the context the request's session carries (anchor, summaries, stored history)
                         goes only where the turns it came from could: their residency, providers,
                         allowed_targets and L1's data policy (router/sessions/carried.py), the turn named
    context              estimated prompt + max_tokens must fit the context window (0 = unknown)
    max_output           the client's max_tokens within the target's output limit
    tools / parallel_tools / structured_output (json_schema, json_object) / streaming / modalities
    completions_api      a /v1/completions request: the target serves the completions API (and echo,
                         logprobs when asked)
    cost                 estimated cost (prompt × price_in + n × output limit × price_out, the output
                         limit being max_tokens or the target's own) within the ceiling; an unpriced
                         target is removed when there is a ceiling (router/limits/budget.py)
    quality_floor        configured quality >= the scenario's floor

Availability (health, breakers) is not a filter: a capable target that is down is reported as
unavailable, not as incapable (router/routing/pipeline.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase

from router.limits.budget import ceiling_refusal
from router.request.contract import RequestContract
from router.routing.capabilities import Target
from router.routing.plugins import UNKNOWN_STATE, Filter, TargetState
from router.sessions.carried import Label

Check = Callable[[RequestContract, Target, TargetState], str | None]

UNKNOWN_CAPABILITIES = "capabilities unknown (configure them; never inferred from the model name)"
L1_DATA_POLICIES = frozenset({"on_prem", "no_retention"})


@dataclass(frozen=True)
class CheckFilter:
    """A filter made of a name and a pure check function."""

    name: str
    check: Check

    def apply(self, contract: RequestContract, target: Target, state: TargetState) -> str | None:
        return self.check(contract, target, state)


def capabilities_known(contract: RequestContract, target: Target, state: TargetState) -> str | None:
    return None if target.known else UNKNOWN_CAPABILITIES


def allowed_targets(contract: RequestContract, target: Target, state: TargetState) -> str | None:
    patterns = contract.allowed_target_patterns
    if any(fnmatchcase(target.id, p) for p in patterns):
        return None
    return f"not allowed by scenario {contract.scenario!r} (allowed_targets: {', '.join(patterns)})"


def providers(contract: RequestContract, target: Target, state: TargetState) -> str | None:
    allowed = contract.allowed_providers
    if allowed is None or target.kind == "local" or target.provider in allowed:
        return None
    return f"provider {target.provider!r} not in x-spillover-providers ({', '.join(sorted(allowed))})"


def residency(contract: RequestContract, target: Target, state: TargetState) -> str | None:
    wanted = contract.residency
    if wanted == "any":
        return None
    if wanted == "local_only":
        return None if target.kind == "local" else "residency local_only: the request may not leave the cluster"
    if target.caps.region in wanted:
        return None
    if not wanted:
        return f"region {target.caps.region!r} not allowed: the scenario's regions and the header's do not intersect"
    return f"region {target.caps.region!r} not in allowed regions ({', '.join(sorted(wanted))})"


def data_policy(contract: RequestContract, target: Target, state: TargetState) -> str | None:
    if contract.level != "L1" or target.caps.data_policy in L1_DATA_POLICIES:
        return None
    return f"data policy {target.caps.data_policy!r} not allowed at L1 (needs on_prem or no_retention)"


def carried_refusal(label: Label, contract: RequestContract, target: Target) -> str | None:
    """Why `target` may not receive context labelled `label` (None: it may): the residency, providers,
    data policy and allowed_targets checks above, applied to the label's constraints."""
    probe = replace(
        contract, level=label.level, residency=label.residency, allowed_providers=label.providers, carried=None
    )
    checks = (("residency", residency), ("providers", providers), ("level", data_policy))
    found = next(((dim, why) for dim, check in checks if (why := check(probe, target, UNKNOWN_STATE))), None)
    for group in label.targets if found is None else ():
        origin = label.origin("targets")
        scenario = replace(probe, allowed_target_patterns=group, scenario=origin.scenario)
        if (why := allowed_targets(scenario, target, UNKNOWN_STATE)) is not None:
            found = ("targets", why)
            break
    if found is None:
        return None
    return f"the context this session carries from {label.origin(found[0]).describe()} may not go here: {found[1]}"


def carried(contract: RequestContract, target: Target, state: TargetState) -> str | None:
    return None if contract.carried is None else carried_refusal(contract.carried, contract, target)


def context(contract: RequestContract, target: Target, state: TargetState) -> str | None:
    window = target.caps.context_window
    if window >= contract.min_context:
        return None
    have = f"context window {window}" if window else "context window unknown (set max_model_len)"
    return (
        f"{have} < needed {contract.min_context} "
        f"(prompt ~{contract.est_prompt_tokens} + max_tokens {contract.max_output_tokens})"
    )


def max_output(contract: RequestContract, target: Target, state: TargetState) -> str | None:
    limit = target.caps.max_output_tokens
    # without the client's max_tokens the target's own limit applies (and bounds a cost estimate)
    if limit is None or not contract.max_tokens_given or contract.max_output_tokens <= limit:
        return None
    return f"max output tokens {limit} < max_tokens {contract.max_output_tokens}"


def tools(contract: RequestContract, target: Target, state: TargetState) -> str | None:
    return "tools (function calling) not supported" if contract.needs_tools and not target.caps.tools else None


def parallel_tools(contract: RequestContract, target: Target, state: TargetState) -> str | None:
    if not contract.needs_parallel_tools or target.caps.parallel_tool_calls:
        return None
    return f"parallel tool calls not supported ({len(contract.tool_schemas)} tools, parallel_tool_calls=true)"


def structured_output(contract: RequestContract, target: Target, state: TargetState) -> str | None:
    if target.caps.json_schema:  # schema-constrained output covers JSON mode too
        return None
    if contract.needs_json_schema:
        return "response_format json_schema (structured outputs) not supported"
    if contract.needs_json_mode:
        return "response_format json_object (JSON mode) not supported"
    return None


def streaming(contract: RequestContract, target: Target, state: TargetState) -> str | None:
    return "streaming not supported" if contract.needs_streaming and not target.caps.streaming else None


def modalities(contract: RequestContract, target: Target, state: TargetState) -> str | None:
    missing = contract.modalities - target.caps.modalities
    if not missing:
        return None
    has = ", ".join(sorted(target.caps.modalities))
    return f"input modality {', '.join(sorted(missing))} not supported (supports {has})"


def completions_api(contract: RequestContract, target: Target, state: TargetState) -> str | None:
    if contract.api != "completions":
        return None
    if not target.caps.completions:
        return "the completions API (/v1/completions) not supported"
    if contract.needs_echo and not target.caps.echo:
        return "completions echo not supported"
    if contract.needs_logprobs and not target.caps.logprobs:
        return "completions logprobs not supported"
    return None


def cost(contract: RequestContract, target: Target, state: TargetState) -> str | None:
    """The request's cost ceiling before any attempt (router/limits/budget.py: the estimate counts `n` and,
    without max_tokens, the target's output limit)."""
    return ceiling_refusal(contract, target)


def quality_floor(contract: RequestContract, target: Target, state: TargetState) -> str | None:
    if target.caps.quality >= contract.quality_floor:
        return None
    return f"quality {target.caps.quality:.2f} < floor {contract.quality_floor:.2f} (scenario {contract.scenario!r})"


DEFAULT_FILTERS: tuple[Filter, ...] = tuple(
    CheckFilter(fn.__name__, fn)
    for fn in (
        capabilities_known,
        allowed_targets,
        providers,
        residency,
        data_policy,
        carried,
        context,
        max_output,
        tools,
        parallel_tools,
        structured_output,
        streaming,
        modalities,
        completions_api,
        cost,
        quality_floor,
    )
)
