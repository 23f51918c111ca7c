"""The two wire protocols the cloud simulator speaks: what differs between them, and only that.

`OpenAIWire` is the OpenAI chat completions API (`POST /v1/chat/completions`, `Authorization:
Bearer`), `AnthropicWire` the Anthropic Messages API (`POST /v1/messages`, `x-api-key` and
`anthropic-version`). The server (server.py) runs the same request cycle, capacity check and
fault draw for both; a wire checks the body, renders replies, SSE events and errors in its
protocol's shapes, and says which statuses its server errors use (the Messages API's overload
is 529).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from bench.cloud_sim import anthropic_api
from bench.cloud_sim.faults import SERVER_ERROR_STATUSES
from bench.cloud_sim.replies import BadChatRequest, ReplyPlan, completion_body, plan_reply, stream_events


class Wire(Protocol):
    path: str
    id_prefix: str
    first_token_event: int
    server_error_statuses: tuple[int, ...]

    def check_headers(self, headers: Mapping[str, str]) -> None: ...

    def presented_key(self, headers: Mapping[str, str]) -> str: ...

    def plan(self, body: Any, models: tuple[str, ...], call_id: str) -> ReplyPlan: ...

    def error(
        self, status: int, message: str, err_type: str, code: str | None, param: str | None
    ) -> dict[str, Any]: ...

    def body(self, plan: ReplyPlan, reply_id: str, created: int) -> dict[str, Any]: ...

    def events(self, plan: ReplyPlan, reply_id: str, created: int) -> list[str]: ...

    def malformed_event(self, reply_id: str) -> str: ...

    def models(self, models: tuple[str, ...], created: int) -> dict[str, Any]: ...


class OpenAIWire:
    path = "/v1/chat/completions"
    id_prefix = "chatcmpl-"
    first_token_event = 1
    server_error_statuses: tuple[int, ...] = SERVER_ERROR_STATUSES  # as `Wire` (a settable member is invariant)

    def check_headers(self, headers: Mapping[str, str]) -> None:
        return None

    def presented_key(self, headers: Mapping[str, str]) -> str:
        scheme, _, presented = headers.get("authorization", "").partition(" ")
        return presented.strip() if scheme.lower() == "bearer" else ""

    def plan(self, body: Any, models: tuple[str, ...], call_id: str) -> ReplyPlan:
        return plan_reply(body, models, call_id)

    def error(self, status: int, message: str, err_type: str, code: str | None, param: str | None) -> dict[str, Any]:
        return {"error": {"message": message, "type": err_type, "param": param, "code": code}}

    def body(self, plan: ReplyPlan, reply_id: str, created: int) -> dict[str, Any]:
        return completion_body(plan, completion_id=reply_id, created=created)

    def events(self, plan: ReplyPlan, reply_id: str, created: int) -> list[str]:
        return stream_events(plan, completion_id=reply_id, created=created)

    def malformed_event(self, reply_id: str) -> str:
        return 'data: {"id":"' + reply_id + '","choices":[{"delta":{"content"\n\n'

    def models(self, models: tuple[str, ...], created: int) -> dict[str, Any]:
        cards = [{"id": m, "object": "model", "created": created, "owned_by": "cloud-sim"} for m in models]
        return {"object": "list", "data": cards}


class AnthropicWire:
    path = "/v1/messages"
    id_prefix = "msg_"
    first_token_event = anthropic_api.FIRST_TOKEN_EVENT
    server_error_statuses: tuple[int, ...] = (500, 529)

    def check_headers(self, headers: Mapping[str, str]) -> None:
        if not headers.get("anthropic-version"):
            raise BadChatRequest("anthropic-version: header is required")

    def presented_key(self, headers: Mapping[str, str]) -> str:
        return headers.get("x-api-key", "").strip()

    def plan(self, body: Any, models: tuple[str, ...], call_id: str) -> ReplyPlan:
        return anthropic_api.plan_messages(body, models, call_id.replace("call_", "toolu_"))

    def error(self, status: int, message: str, err_type: str, code: str | None, param: str | None) -> dict[str, Any]:
        return anthropic_api.error_body(status, message)

    def body(self, plan: ReplyPlan, reply_id: str, created: int) -> dict[str, Any]:
        return anthropic_api.message_body(plan, message_id=reply_id)

    def events(self, plan: ReplyPlan, reply_id: str, created: int) -> list[str]:
        return anthropic_api.message_events(plan, message_id=reply_id)

    def malformed_event(self, reply_id: str) -> str:
        return 'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"text"\n\n'

    def models(self, models: tuple[str, ...], created: int) -> dict[str, Any]:
        return anthropic_api.models_body(models)


def wire_for(api: str) -> Wire:
    return AnthropicWire() if api == "anthropic" else OpenAIWire()
