"""The standby's dry-run before a switch: a minimal request with the scenario's tools / schema.

Before an operator's switch moves any traffic, the standby is sent one small chat — the operator's
`dry_run` sample (`messages`, `tools`, `tool_choice`, `response_format`; checked as hostile input
like a client's request), else "Reply with the word OK." — under the scenario's contract, held to
L1: the answer must come within `traffic.migration.dry_run_timeout_s` and pass its output contract
(router/output/output_contract.py, the check the dispatcher runs). Anything else refuses the switch
(`409 dry_run_failed`, recorded in the board's history and `/metrics`).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from router.error_codes import ErrorCode
from router.errors import DryRunFailed, InvalidRequest, RequestError
from router.headers import SCENARIO
from router.request.contract import derive_contract
from router.request.openai_request import parse_body
from router.routing.capabilities import Registry, Target
from router.routing.policy import Policy
from serve_apps.backend import CloudBackend, ModelBackend
from serve_apps.streams.output_check import checked

SAMPLE_FIELDS = {"messages", "tools", "tool_choice", "response_format", "max_tokens"}
DEFAULT_MESSAGES = [{"role": "user", "content": "Reply with the word OK."}]


def dry_run_body(model: str, sample: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(sample) - SAMPLE_FIELDS)
    if unknown:
        raise InvalidRequest(
            f"dry_run takes only {sorted(SAMPLE_FIELDS)}; unknown: {unknown[:5]}",
            param="dry_run",
            code=ErrorCode.INVALID_TRAFFIC_COMMAND,
        )
    body = {"messages": DEFAULT_MESSAGES, "max_tokens": 64, "temperature": 0, **sample, "model": model}
    try:
        raw = json.dumps(body).encode()
        return parse_body(raw, "chat").body  # the same checks as a client's request
    except RequestError as exc:
        raise InvalidRequest(
            f"dry_run: {exc.message}", param="dry_run", code=ErrorCode.INVALID_TRAFFIC_COMMAND
        ) from None
    except (TypeError, ValueError):
        raise InvalidRequest("dry_run must be JSON", param="dry_run", code=ErrorCode.INVALID_TRAFFIC_COMMAND) from None


class DryRun:
    def __init__(
        self,
        registry: Registry,
        local: ModelBackend,
        providers: Mapping[str, CloudBackend],
        policy: Policy,
        *,
        timeout_s: float,
    ) -> None:
        self._registry = registry
        self._local = local
        self._providers = dict(providers)
        self._policy = policy
        self._timeout_s = timeout_s

    def target(self, model: str, endpoint: str) -> Target | None:
        return next((t for t in self._registry.for_alias(model) if t.endpoint == endpoint), None)

    async def run(self, model: str, scenario: str | None, endpoint: str, sample: Mapping[str, Any]) -> str:
        """What the standby answered (a short summary); DryRunFailed saying why otherwise."""
        body = dry_run_body(model, sample)
        headers = {SCENARIO: scenario} if scenario else {}
        contract = replace(await asyncio.to_thread(derive_contract, body, headers, self._policy), level="L1")
        target = self.target(model, endpoint)
        if target is None or (target.kind == "cloud" and target.provider not in self._providers):
            raise DryRunFailed(f"{endpoint} does not serve {model} (not configured or not enabled)")
        request_id = f"dry-run-{uuid.uuid4().hex[:12]}"
        try:
            reply = await asyncio.wait_for(self._call(target, body, request_id), self._timeout_s)
            reply, _ = await checked("chat", reply, contract, target)
        except TimeoutError:
            raise DryRunFailed(f"{endpoint} did not answer the dry-run within {self._timeout_s:g}s") from None
        except RequestError as exc:
            raise DryRunFailed(f"{endpoint} failed the dry-run ({exc.code}): {exc.message}"[:400]) from None
        choices = (reply.body or {}).get("choices") or [{}]
        message = choices[0].get("message") or {}
        answer = str(message.get("content") or message.get("tool_calls") or "")
        if not answer.strip():
            raise DryRunFailed(f"{endpoint} answered the dry-run with nothing")
        return answer[:200]

    async def _call(self, target: Target, body: dict[str, Any], request_id: str) -> Any:
        if target.kind == "local":
            return await self._local.call(target.alias, "chat", body, request_id)
        return await self._providers[target.provider or ""].chat(target.alias, body, request_id)
