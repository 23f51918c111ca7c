"""`ModelBackend` over Ray Serve DeploymentHandles to ray.serve.llm `LLMServer`s.

This is the one place where errors from Ray, vLLM's protocol models and the engine's
`ErrorResponse` are translated into `router.errors` classes. The call shape mirrors Ray's
own OpenAiIngress: `handle.options(stream=True).chat.remote(request, raw_request_info)`
yields either one complete response, lists of SSE strings, or an `ErrorResponse`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from pydantic import ValidationError
from ray.exceptions import RayError
from ray.serve.handle import DeploymentHandle
from ray.serve.llm.openai_api_models import ChatCompletionRequest, CompletionRequest

from router.errors import InvalidRequest, TargetUnavailable, UpstreamError
from router.request.openai_request import Kind
from serve_apps.backend import BackendReply
from serve_apps.engine.replies import DONE, error_in_events, is_error_response, to_sse, translate_error_response


def _validation_error(exc: ValidationError) -> InvalidRequest:
    first = exc.errors()[0]
    param = ".".join(str(p) for p in first["loc"]) or None
    return InvalidRequest(f"invalid request: {param}: {first['msg']}", param=param)


class ServeHandleBackend:
    """Calls model deployments through their DeploymentHandles, keyed by model alias."""

    def __init__(self, handles: dict[str, DeploymentHandle]) -> None:
        self._streaming = {alias: h.options(stream=True) for alias, h in handles.items()}
        self._plain = dict(handles)

    async def call(self, alias: str, kind: Kind, body: dict[str, Any], request_id: str) -> BackendReply:
        try:
            request_cls = ChatCompletionRequest if kind == "chat" else CompletionRequest
            request = request_cls.model_validate(body)
        except ValidationError as exc:
            raise _validation_error(exc) from None
        method = getattr(self._streaming[alias], "chat" if kind == "chat" else "completions")
        stream = method.remote(request, None)
        try:
            first = await stream.__anext__()
        except StopAsyncIteration:
            raise UpstreamError(f"model {alias!r} returned an empty response") from None
        except RayError as exc:
            raise TargetUnavailable(f"model {alias!r} is unavailable: {type(exc).__name__}") from None
        except asyncio.CancelledError:
            stream.cancel()  # the gateway gave up before the first byte (e.g. failed over)
            raise
        head = first[0] if isinstance(first, list) and first else first
        if is_error_response(head):
            stream.cancel()
            raise translate_error_response(head)
        if isinstance(head, str) and (failed := error_in_events(head)) is not None:
            stream.cancel()  # failed before its first byte reached anyone: the dispatcher may fail over
            raise failed
        if not body.get("stream") and hasattr(head, "model_dump"):
            return BackendReply(body=head.model_dump(mode="json", exclude_none=True))
        return BackendReply(chunks=self._rest(first, stream))

    async def _rest(self, first: Any, stream: Any) -> AsyncIterator[str]:
        sent_done = False
        try:
            items = [first]
            while True:
                for item in items:
                    text = to_sse(item)
                    if (failed := error_in_events(text)) is not None:
                        raise failed  # ended by the gateway's own error event (or continued elsewhere)
                    sent_done = sent_done or text.rstrip().endswith("[DONE]")
                    yield text
                try:
                    items = [await stream.__anext__()]
                except StopAsyncIteration:
                    break
        except RayError as exc:
            raise UpstreamError(f"the model replica failed mid-stream: {type(exc).__name__}") from None
        finally:
            stream.cancel()
        if not sent_done:
            yield DONE

    async def check_health(self, alias: str, timeout_s: float) -> str | None:
        try:
            await asyncio.wait_for(self._plain[alias].check_health.remote(), timeout_s)
        except TimeoutError:
            return f"health check timed out after {timeout_s:g}s"
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready", reported by name
            return f"unhealthy: {type(exc).__name__}"
        return None
