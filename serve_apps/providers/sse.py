"""A cloud provider's SSE response as an async iterator of complete events.

`ProviderEventStream` reads an open streamed `httpx.Response`, yields each event as
`data: <json>\\n\\n` (the same shape `serve_apps.backend.BackendReply.chunks` carries) and
ends after `data: [DONE]\\n\\n`. Everything that can go wrong after the first byte raises
`UpstreamError`: a transport failure or an end before `[DONE]` (code `provider_cut`),
a `data:` payload that is not a JSON object (`provider_malformed`), an error object sent
mid-stream (`provider_stream_error`), a stream past the provider's `max_reply_bytes`
(`provider_reply_too_large`, serve_apps/providers/bounded.py). The response is closed when the stream ends, fails or
is `aclose()`d — call `aclose()` when abandoning a stream early.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Protocol

import httpx

from cluster.config.cloud import DEFAULT_MAX_REPLY_BYTES
from router.error_codes import ErrorCode
from router.errors import UpstreamError
from serve_apps.providers.bounded import BoundedLines, loads
from serve_apps.providers.tolerance import StreamTolerance

DONE = "data: [DONE]\n\n"


class EventStream(Protocol):
    """What a provider adapter's streamed reply is: OpenAI SSE events, closable when abandoned."""

    def __aiter__(self) -> AsyncIterator[str]: ...

    async def __anext__(self) -> str: ...

    async def aclose(self) -> None: ...


class ResponseEvents:
    """The iterator plumbing of a provider's streamed reply: `_read()` yields its events from `_lines()`
    (the whole stream at most `max_bytes`: past it the stream fails with `provider_reply_too_large`);
    closing the stream closes the response (subclasses: ProviderEventStream, the Anthropic stream)."""

    def __init__(self, response: httpx.Response, provider: str, max_bytes: int = DEFAULT_MAX_REPLY_BYTES) -> None:
        self._response = response
        self._lines = BoundedLines(response, max_bytes, provider)
        self.tolerance = StreamTolerance()
        self._events = self._read()

    def _read(self) -> AsyncGenerator[str, None]:
        raise NotImplementedError

    def __aiter__(self) -> ResponseEvents:
        return self

    async def __anext__(self) -> str:
        return await self._events.__anext__()

    async def aclose(self) -> None:
        await self._events.aclose()
        await self._response.aclose()


class ProviderEventStream(ResponseEvents):
    def __init__(
        self,
        response: httpx.Response,
        provider: str,
        redact: Callable[[str], str],
        *,
        max_bytes: int = DEFAULT_MAX_REPLY_BYTES,
    ) -> None:
        self._provider = provider
        self._redact = redact
        super().__init__(response, provider, max_bytes)

    async def _read(self) -> AsyncGenerator[str, None]:
        data: list[str] = []
        try:
            async for line in self._lines():
                if line:
                    if line.startswith("data:"):
                        data.append(line[5:].removeprefix(" "))
                    continue  # comments (":"), event:, id:, retry: carry nothing we pass on
                if not data:
                    continue
                payload, data = "\n".join(data), []
                if payload == "[DONE]":
                    yield DONE
                    return
                event = self._event(payload)
                if event is not None:
                    yield event
        except httpx.RequestError as exc:
            self.tolerance.ended(self._cut(f"the connection failed mid-stream ({type(exc).__name__})"))
            yield DONE
            return
        finally:
            await self._response.aclose()
        self.tolerance.ended(self._cut("the stream ended before [DONE]"))
        yield DONE

    def _event(self, payload: str) -> str | None:
        chunk = loads(payload)  # too deep, or a lone surrogate: malformed like any other bad event
        if not isinstance(chunk, dict):
            message = f"cloud provider {self._provider!r} sent a stream event that is not a JSON object"
            self.tolerance.malformed(UpstreamError(message, code=ErrorCode.PROVIDER_MALFORMED))
            return None
        if "error" in chunk:
            error = chunk["error"]
            detail = error.get("message") if isinstance(error, dict) else error
            message = f"cloud provider {self._provider!r} failed mid-stream: {self._redact(str(detail))[:500]}"
            raise UpstreamError(message, code=ErrorCode.PROVIDER_STREAM_ERROR)
        self.tolerance.valid(chunk)
        if "\n" in payload:
            payload = json.dumps(chunk, separators=(",", ":"))
        return f"data: {payload}\n\n"

    def _cut(self, reason: str) -> UpstreamError:
        return UpstreamError(f"cloud provider {self._provider!r}: {reason}", code=ErrorCode.PROVIDER_CUT)
