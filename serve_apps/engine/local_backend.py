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
import logging
import threading
import time
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
    error_in_events,
    is_error_response,
    to_sse,
    translate_error_response,
)

log = logging.getLogger("spillover.gateway")
SLOW_CANCEL_S = 1.0


def cancel_off_loop(stream: Any) -> None:
    """`stream.cancel()` in a thread of its own. Serve's `DeploymentResponseGenerator.cancel()` is synchronous (it
    resolves the call's assignment, then `ray.cancel`s the replica's task). Seen on the real stack with an engine
    frozen under load: from the moment the gateway failed over its calls to that replica until the replica's
    watchdog killed the engine, 10 s, the gateway took in no request (health reads included); a cancel that
    waits is the one synchronous step on that path, and a slow one is logged here. Where Serve runs the handle's
    router on the caller's own loop (RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP=0) its cancel does not wait, and
    must stay on that loop."""
    if not getattr(stream, "_is_router_running_in_separate_loop", True):
        stream.cancel()
        return

    def run() -> None:
        began = time.monotonic()
        try:
            stream.cancel()
        except Exception:
            log.exception("cancelling a local call failed")
        took = time.monotonic() - began
        if took > SLOW_CANCEL_S:
            log.warning("cancelling a local call took %.1fs (off the event loop)", took)

    threading.Thread(target=run, name="spillover-cancel", daemon=True).start()


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
            raise TargetUnavailable(f"model {alias!r} is unavailable: {type(exc).__name__}") from None
        except asyncio.CancelledError:
            cancel_off_loop(stream)  # the gateway gave up before the first byte (e.g. failed over)
            raise
        head = first[0] if isinstance(first, list) and first else first
        if is_error_response(head):
            cancel_off_loop(stream)
            raise translate_error_response(head)
        if isinstance(head, str) and (failed := error_in_events(head)) is not None:
            cancel_off_loop(stream)  # failed before its first byte reached anyone: the dispatcher may fail over
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
            raise UpstreamError(f"the model replica failed mid-stream: {type(exc).__name__}") from None
        finally:
            cancel_off_loop(stream)
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
