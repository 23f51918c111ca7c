"""`ModelBackend` over Ray Serve DeploymentHandles to ray.serve.llm `LLMServer`s.

This is the one place where errors from Ray and the engine's replies are translated into
`router.errors` classes. The call is the replica's `serve_body` (serve_apps/engine/llm_server.py):
the request body as JSON, validated by the replica into vLLM's request class and answered in plain
values (serve_apps/engine/replies.py) — one complete response, lists of SSE strings, or an error —
so this process never imports vLLM or torch. Otherwise the shape is Ray's own OpenAiIngress's
(`handle.options(stream=True).chat.remote(request, raw_request_info)`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from ray.exceptions import RayError
from ray.serve.handle import DeploymentHandle

from router.errors import TargetUnavailable, UpstreamError
from router.request.openai_request import Kind
from serve_apps.backend import BackendReply
from serve_apps.engine.replies import (
    DONE,
    Complete,
    EngineFailed,
    error_in_events,
    is_error_response,
    to_sse,
    translate_error_response,
)


class ServeHandleBackend:
    """Calls model deployments through their DeploymentHandles, keyed by model alias."""

    def __init__(self, handles: dict[str, DeploymentHandle]) -> None:
        self._streaming = {alias: h.options(stream=True) for alias, h in handles.items()}
        self._plain = dict(handles)

    async def call(self, alias: str, kind: Kind, body: dict[str, Any], request_id: str) -> BackendReply:
        stream: Any = self._streaming[alias].serve_body.remote(kind, body)  # a generator: the handle streams
        try:
            first = await stream.__anext__()
        except StopAsyncIteration:
            raise UpstreamError(f"model {alias!r} returned an empty response") from None
        except RayError as exc:
            raise TargetUnavailable(f"model {alias!r} is unavailable: {ray_reason(exc)}") from None
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
        if not body.get("stream") and isinstance(head, Complete):
            return BackendReply(body=head.body)
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
            raise UpstreamError(f"the model replica failed mid-stream: {ray_reason(exc)}") from None
        finally:
            stream.cancel()
        if not sent_done:
            yield DONE

    async def check_health(self, alias: str, timeout_s: float) -> str | None:
        try:
            await asyncio.wait_for(self._plain[alias].check_health.remote(), timeout_s)
        except TimeoutError:
            return f"health check timed out after {timeout_s:g}s"
        except RayError as exc:
            return f"unhealthy: {ray_reason(exc)}"
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready", reported by name
            return f"unhealthy: {type(exc).__name__}"
        return None


def ray_reason(exc: RayError) -> str:
    """What a failed replica call says about why: Ray's class, and the engine's own error where the replica
    raised one (`EngineFailed`: the class name and message of what vLLM raised, e.g. a dead engine). Nothing
    else of Ray's text, which carries the remote traceback, node addresses and actor ids, reaches a client."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, EngineFailed):
        return f"{type(exc).__name__}: {str(cause)[:300]}"
    return type(exc).__name__
