"""The output contract applied to a complete chat answer (router/output/output_contract.py decides).

The check runs in a worker thread of the gateway's schema-check pool (serve_apps/off_loop/check_pool.py: per-tenant
admission, fair hand-over), bounded by VALIDATION_TIMEOUT_S once it runs: a hostile schema or answer never
holds the event loop that serves every other request, nor another tenant's checks. An L1 answer that
breaks its contract raises `ContractViolation` carrying the tokens the answer spent (the attempt is still
paid for); L2 passes with the `x-spillover-contract` header; a repaired answer (JSON extracted from
surrounding text) replaces the original.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from router.output.output_contract import (
    CONTRACT_HEADER,
    VALIDATION_TIMEOUT_S,
    OutputVerdict,
    check_output,
    contract_violation,
    enforce,
)
from router.request.contract import RequestContract
from router.request.openai_request import Kind
from router.routing.capabilities import Target
from serve_apps.backend import BackendReply
from serve_apps.off_loop.check_pool import CheckRunner, Unpooled


def usage(reply: BackendReply) -> tuple[int, int]:
    """(prompt, completion) tokens a complete answer reports (0, 0 without usage)."""
    found = (reply.body or {}).get("usage") or {}
    return int(found.get("prompt_tokens") or 0), int(found.get("completion_tokens") or 0)


async def off_loop(check: Callable[[], OutputVerdict], runner: CheckRunner, tenant: str) -> OutputVerdict:
    """Run one output check of `tenant` in a worker thread, bounded by VALIDATION_TIMEOUT_S (+1 s) of running."""
    try:
        return await runner.run(tenant, check, timeout_s=VALIDATION_TIMEOUT_S + 1.0)
    except TimeoutError:
        error = f"the answer could not be checked within {VALIDATION_TIMEOUT_S:g}s"
        return OutputVerdict("violated", (error,), error_count=1)


async def checked(
    kind: Kind,
    reply: BackendReply,
    contract: RequestContract,
    target: Target,
    flagged: list[str] | None = None,
    runner: CheckRunner | None = None,
) -> tuple[BackendReply, dict[str, str]]:
    """The answer as the client may receive it, and the headers the check adds; the errors of a
    violation let through (L2) are appended to `flagged`. Streams: serve_apps/streams/contract.py."""
    headers: dict[str, str] = {}
    if kind != "chat" or reply.body is None or not contract.checks_output:
        return reply, headers
    choices = reply.body.get("choices") or [{}]
    message = choices[0].get("message") or {}
    verdict = await off_loop(partial(check_output, contract, message), runner or Unpooled(), contract.tenant or "")
    action = enforce(contract.level, verdict)
    if action.kind == "retry_next_or_fail":
        violation = contract_violation(verdict, target.id)
        violation.usage = usage(reply)
        raise violation
    if action.content is not None:
        message = {**choices[0].get("message", {}), "content": action.content}
        reply = BackendReply(body={**reply.body, "choices": [{**choices[0], "message": message}]})
    if action.header:
        headers[CONTRACT_HEADER] = action.header
    if flagged is not None and action.kind == "pass_with_warning":
        flagged += action.errors
    return reply, headers
