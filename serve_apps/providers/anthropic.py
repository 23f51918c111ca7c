"""Adapter to a cloud provider that speaks the Anthropic Messages API (`type: anthropic`).

`AnthropicProvider` has the interface of `OpenAICompatProvider` (whose transport, key handling
and redaction it shares): the gateway hands it an OpenAI chat body and gets an OpenAI chat
completion or OpenAI SSE chunks back. The translation itself is pure (`anthropic_wire`); this
module sends `POST messages` with `x-api-key`, `anthropic-version` and `x-request-id`, reads the
reply or the event stream, and is the one place where the Messages API's errors become
`router.errors` classes:

    HTTP 429 rate_limit_error         ProviderRateLimited  retry_after_s from retry-after
    HTTP 529 overloaded_error         ProviderOverloaded   503 provider_overloaded (retry-after kept)
    HTTP 401 / 403 / 402 billing      UpstreamError        provider_auth_failed (our key or account)
    HTTP 408 / 504 timeout_error      TargetUnavailable    provider_timeout
    other HTTP 4xx                    ProviderRejected     the provider's message; 400/404/422 kept
    HTTP 5xx (api_error)              UpstreamError        provider_error
    body / event not in the documented shape   UpstreamError   provider_malformed
    `error` event mid-stream          UpstreamError        provider_stream_error
    stream ends before message_stop   UpstreamError        provider_cut
Transport failures are translated by the shared `_send` exactly as for OpenAI-compatible providers.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any

import httpx

from cluster.config.cloud import DEFAULT_MAX_REPLY_BYTES
from router import headers as hdr
from router.error_codes import ErrorCode
from router.errors import ModelNotFound, ProviderOverloaded, RequestError, UpstreamError
from router.routing.capabilities import ProviderModel
from serve_apps.providers.anthropic_wire import ChunkTranslator, chat_completion, malformed, messages_request
from serve_apps.providers.bounded import loads
from serve_apps.providers.openai_compat import (
    FORWARDED_HEADERS,
    OpenAICompatProvider,
    ProviderReply,
    _error_detail,
    _redactor,
    kept_headers,
    retry_after_s,
    status_error,
)
from serve_apps.providers.sse import DONE, ResponseEvents

ANTHROPIC_VERSION = "2023-06-01"  # the Messages API version this adapter speaks
DEFAULT_MAX_TOKENS = 4096  # the Messages API requires max_tokens: used when the client and the entry give none
_MAX_DETAIL = 500


class AnthropicProvider(OpenAICompatProvider):
    def __repr__(self) -> str:
        return f"AnthropicProvider(name={self.name!r}, base_url={self.config.base_url!r})"

    async def chat(
        self, alias: str, body: dict[str, Any], request_id: str, *, extra_headers: Mapping[str, str] | None = None
    ) -> ProviderReply:
        model = self._model_for(alias)
        key = self._api_key()
        redact = _redactor(key)
        payload = messages_request(body, model, self._default_max_tokens(alias))
        stream = payload.get("stream") is True
        headers = {k.lower(): v for k, v in (extra_headers or {}).items() if k.lower() in FORWARDED_HEADERS}
        headers.update(self._auth_headers(key))
        headers[hdr.REQUEST_ID] = request_id
        headers["accept"] = "text/event-stream" if stream else "application/json"
        request = self._client.build("POST", "messages", json_body=payload, headers=headers)
        response = await self._send(request, redact)
        try:
            return await self._translated(response, stream, _include_usage(body), redact)
        except BaseException:
            await response.aclose()
            raise

    async def completions(
        self, alias: str, body: dict[str, Any], request_id: str, *, extra_headers: Mapping[str, str] | None = None
    ) -> ProviderReply:
        """The Messages API has no completions: the config refuses `completions: true` for this provider type, so
        no plan sends one here (cluster/config/cloud.py)."""
        raise ModelNotFound(f"cloud provider {self.name!r} (Anthropic Messages API) has no completions API")

    async def probe(self) -> None:
        """Liveness: `GET models` with our key (a refused key is `provider_auth_failed`)."""
        key = self._api_key()
        redact = _redactor(key)
        request = self._client.build("GET", "models", headers=self._auth_headers(key))
        response = await self._send(request, redact)
        content = await self._read(response, error=True)  # only an error's start is ever read
        if not 200 <= response.status_code < 300:
            raise self._status_error(response.status_code, response.headers, content, redact)

    def _auth_headers(self, key: str | None) -> dict[str, str]:
        headers = {"anthropic-version": ANTHROPIC_VERSION}
        if key:
            headers["x-api-key"] = key
        return headers

    def _default_max_tokens(self, alias: str) -> int:
        entry = self.config.models.get(alias)
        if isinstance(entry, ProviderModel):
            return entry.max_output_tokens or min(DEFAULT_MAX_TOKENS, entry.context_window)
        return DEFAULT_MAX_TOKENS

    def _status_error(
        self, status: int, headers: Mapping[str, str], content: bytes, redact: Callable[[str], str]
    ) -> RequestError:
        return anthropic_status_error(self.name, status, headers, content, redact)

    async def _translated(
        self, response: httpx.Response, stream: bool, include_usage: bool, redact: Callable[[str], str]
    ) -> ProviderReply:
        status = response.status_code
        headers = kept_headers(response.headers)
        if not 200 <= status < 300:
            raise self._status_error(status, response.headers, await self._read(response, error=True), redact)
        content_type = response.headers.get("content-type", "")
        created = int(self._clock())
        if stream:
            if not content_type.startswith("text/event-stream"):
                await self._read(response, error=True)
                raise malformed(self.name, f"a stream request's answer as {content_type or 'no type'}")
            translator = ChunkTranslator(self.name, created, include_usage=include_usage)
            return ProviderReply(
                status=status,
                headers=headers,
                chunks=AnthropicEventStream(
                    response, self.name, translator, redact, max_bytes=self.config.max_reply_bytes
                ),
            )
        message = loads(await self._read(response))  # bounded by max_reply_bytes; too deep: None (malformed)
        return ProviderReply(status=status, headers=headers, body=chat_completion(message, created, self.name))


def anthropic_status_error(
    provider: str, status: int, headers: Mapping[str, str], content: bytes, redact: Callable[[str], str]
) -> RequestError:
    """The spillover error for a Messages API non-2xx answer."""
    detail = redact(_error_detail(content)[0])[:_MAX_DETAIL]
    who = f"cloud provider {provider!r}"
    if status == 529:
        message = f"{who} is overloaded (HTTP 529): {detail}"
        return ProviderOverloaded(message, retry_after_s=retry_after_s(headers))
    if status == 402:
        message = f"{who} refused our account (HTTP 402, billing); check its plan or credits"
        return UpstreamError(message, code=ErrorCode.PROVIDER_AUTH_FAILED)
    if status == 504:
        return status_error(provider, 408, headers, content, redact)
    return status_error(provider, status, headers, content, redact)


def _include_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


class AnthropicEventStream(ResponseEvents):
    """A Messages API event stream as OpenAI SSE events (`data: {...}\\n\\n`, then `data: [DONE]`)."""

    def __init__(
        self,
        response: httpx.Response,
        provider: str,
        translator: ChunkTranslator,
        redact: Callable[[str], str],
        *,
        max_bytes: int = DEFAULT_MAX_REPLY_BYTES,
    ) -> None:
        self._provider = provider
        self._translator = translator
        self._redact = redact
        super().__init__(response, provider, max_bytes)

    async def _read(self) -> AsyncGenerator[str, None]:
        event, data = "", []
        try:
            async for line in self._lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].removeprefix(" "))
                elif not line and data:
                    payload, data = "\n".join(data), []
                    for chunk in self._translate(event, payload):
                        yield chunk
                    event = ""
                    if self._translator.done:
                        yield DONE
                        return
        except httpx.RequestError as exc:
            self.tolerance.ended(self._cut(f"the connection failed mid-stream ({type(exc).__name__})"))
        else:
            self.tolerance.ended(self._cut("the stream ended before message_stop"))
        finally:
            await self._response.aclose()
        for chunk in self._translate("message_stop", "{}"):  # after a stop_reason: finalised (usage kept)
            yield chunk
        yield DONE

    def _translate(self, event: str, payload: str) -> list[str]:
        data = loads(payload)
        if data is None:
            self.tolerance.malformed(malformed(self._provider, "a stream event that is not JSON"))
            return []
        try:
            chunks = self._translator.feed(event, data)
        except UpstreamError as exc:  # an error event quotes the provider: scrub our key from it
            raise exc.with_message(self._redact(exc.message)) from None
        self.tolerance.valid({"choices": [c for chunk in chunks for c in chunk.get("choices") or []]})
        return [f"data: {json.dumps(c, separators=(',', ':'))}\n\n" for c in chunks]

    def _cut(self, reason: str) -> UpstreamError:
        return UpstreamError(f"cloud provider {self._provider!r}: {reason}", code=ErrorCode.PROVIDER_CUT)
