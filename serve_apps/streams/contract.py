"""The output contract applied to streamed answers (router/output/tool_calls.py assembles,
router/output/output_contract.py decides; serve_apps/streams/output_check.py does the same for complete answers).

    end_check(kind, contract, target)   the check `serve_apps.streams.account.accounted` runs when a stream
                                        reaches `[DONE]`: L2 → the violation is flagged (recorded, counted
                                        in /metrics) and the answer passes; L1 → the stream ends with a
                                        `contract_violation` error event instead of `[DONE]`
    held_until_checked(...)             L1 streams with tools: nothing reaches the client until the
                                        answer shows content (a text answer: it streams on, and tool
                                        calls that follow are checked at the end) or ends. An answer
                                        made of tool calls only is therefore checked before its first
                                        byte leaves, and a violation moves on to the next capable
                                        target or ends as 502 `contract_violation`, as for a
                                        non-streamed answer. A request whose `tool_choice` obliges a
                                        call (`must_call`) is held to its end: text is no answer to it.

L1 streams with a `json_schema` / `json_object` response format are refused at the HTTP edge (their
text streams as it is written, so it could only be checked after it was sent).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial

from router.output.output_contract import contract_violation, enforce
from router.output.tool_calls import StreamedMessage, check_streamed
from router.request.contract import RequestContract
from router.request.openai_request import Kind
from router.routing.capabilities import Target
from serve_apps.backend import BackendReply
from serve_apps.off_loop.check_pool import CheckRunner
from serve_apps.streams.account import StreamCheck, StreamVerdict, Tally, close_stream
from serve_apps.streams.output_check import off_loop


def end_check(kind: Kind, contract: RequestContract, target: Target, runner: CheckRunner) -> StreamCheck | None:
    """The check of a complete streamed answer, or None when the request has no output contract."""
    if kind != "chat" or not contract.checks_output:
        return None

    async def check(message: StreamedMessage) -> StreamVerdict:
        verdict = await off_loop(partial(check_streamed, contract, message), runner, contract.tenant or "")
        action = enforce(contract.level, verdict)
        if action.kind == "retry_next_or_fail":
            return StreamVerdict(errors=verdict.errors, violation=contract_violation(verdict, target.id))
        if action.kind == "pass_with_warning":
            return StreamVerdict(flagged=action.header, errors=action.errors)
        return StreamVerdict()

    return check


def holds_back(kind: Kind, contract: RequestContract) -> bool:
    return kind == "chat" and contract.level == "L1" and bool(contract.tool_schemas)


async def held_until_checked(
    reply: BackendReply, contract: RequestContract, target: Target, runner: CheckRunner
) -> BackendReply:
    """See the module docstring. Raises `ContractViolation` (with the tokens spent) for an answer
    of tool calls that breaks its schemas, and whatever the stream raised before it showed content."""
    assert reply.chunks is not None
    chunks, held, peek = reply.chunks, [], Tally()
    try:
        whole = contract.must_call is not None  # text is a violation too: hold it all
        while not peek.done and (whole or not peek.message.has_content):
            try:
                text = await chunks.__anext__()
            except StopAsyncIteration:
                break
            held.append(text)
            peek.feed(text)
        if (whole or not peek.message.has_content) and peek.error_event is None:
            verdict = await off_loop(partial(check_streamed, contract, peek.message), runner, contract.tenant or "")
            if enforce(contract.level, verdict).kind == "retry_next_or_fail":
                violation = contract_violation(verdict, target.id)
                prompt, completion, _ = peek.tokens(contract.est_prompt_tokens)
                violation.usage = (prompt, completion)
                raise violation
    except BaseException:
        await close_stream(chunks)
        raise
    return BackendReply(chunks=_replayed(held, chunks))


async def _replayed(held: list[str], rest: AsyncIterator[str]) -> AsyncIterator[str]:
    try:
        for text in held:
            yield text
        async for text in rest:
            yield text
    finally:
        await close_stream(rest)
