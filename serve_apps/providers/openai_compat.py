"""Adapter to one cloud provider with an OpenAI-compatible chat API, over `httpx.AsyncClient`.

`OpenAICompatProvider.chat(alias, body, request_id)` (and `.completions(...)`, the legacy completions API, for a
/v1/completions request that bursts) maps the model alias to the provider's
model name, sends the request (with `x-request-id` and the API key read from the environment
variable the config names, at call time) and returns a `ProviderReply`: the JSON body, or an
iterator of SSE events for `"stream": true`.

Only what the provider may receive is sent: the body is rebuilt from `CHAT_FIELDS` (OpenAI chat
parameters the gateway understands, `COMPLETION_FIELDS` for a completion; `store`, `metadata`, `user` and
anything unknown are dropped, so a client cannot make the provider keep or tag its data), and the only headers are
`x-request-id`, `accept`, `content-type`, the key, and `FORWARDED_HEADERS` from `extra_headers`.

This module is the one place where httpx errors and provider HTTP errors become
`router.errors` classes:

    connect / DNS / TLS / timeout before a response  TargetUnavailable    provider_unreachable / provider_timeout
    API key variable unset                           TargetUnavailable    provider_not_configured (the
                                                                          variable's name only in the log)
    HTTP 429                                         ProviderRateLimited  retry_after_s from retry-after(-ms)
    HTTP 408                                         TargetUnavailable    provider_timeout
    HTTP 401 / 403                                   UpstreamError        provider_auth_failed (no provider text)
    HTTP 400 context_length_exceeded                 ProviderContextExceeded  fails over (serve_apps/providers/
                                                                          capability_errors.py)
    other HTTP 4xx                                   ProviderRejected     provider's message; 400/404/422 kept
    HTTP 5xx, other non-2xx                          UpstreamError        provider_error
    body not a JSON completion / bad SSE event       UpstreamError        provider_malformed (JSON too deep
                                                                          or with a lone surrogate included)
    body or stream past `max_reply_bytes`             UpstreamError        provider_reply_too_large (see
                                                                          `bounded`; fails over)
    connection lost after the response started       UpstreamError        provider_cut (see `sse`)
    alias not mapped for this provider               ModelNotFound

The API key never appears in a repr, a log line or an error message: it is only put in the
Authorization header of each request, and provider texts quoted in errors are scrubbed of it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from cluster.config.cloud import CloudProvider
from router import headers as hdr
from router.error_codes import ErrorCode
from router.errors import (
    ModelNotFound,
    ProviderContextExceeded,
    ProviderRateLimited,
    ProviderRejected,
    RequestError,
    TargetUnavailable,
    UpstreamError,
)
from router.request.engine_fields import OPENAI_FIELDS
from router.routing.capabilities import provider_model_name
from serve_apps.backend import BackendReply
from serve_apps.providers.bounded import ERROR_BODY_BYTES, loads, read_body, read_prefix
from serve_apps.providers.capability_errors import context_exceeded
from serve_apps.providers.http_client import ProviderClient
from serve_apps.providers.sse import ProviderEventStream

log = logging.getLogger("spillover.providers")

KEPT_HEADERS = frozenset({hdr.REQUEST_ID, "retry-after", "retry-after-ms", "content-type"})
CHAT_FIELDS = frozenset(
    {
        "messages",
        "model",
        "frequency_penalty",
        "presence_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "max_tokens",
        "max_completion_tokens",
        "n",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "temperature",
        "top_p",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "reasoning_effort",
    }
)
# the legacy completions API's parameters (a /v1/completions request that bursts): the ones a local engine gets
# (router/request/engine_fields.py) less `user`, as for chat; `best_of` and anything unknown are never sent
COMPLETION_FIELDS = OPENAI_FIELDS["completions"] - {"user"}
# vLLM's chat extension a stream continuation sends (router/resilience/continuation.py); forwarded only as booleans
PREFILL_FIELDS = frozenset({"continue_final_message", "add_generation_prompt"})
FORWARDED_HEADERS = frozenset({hdr.ATTEMPT})
KEPT_HEADER_PREFIXES = ("openai-", "x-ratelimit-", "anthropic-ratelimit-")
_MAX_DETAIL = 500


@dataclass(frozen=True)
class ProviderReply(BackendReply):
    """A `BackendReply` (exactly one of `body`, a complete chat completion, or `chunks`, a
    `ProviderEventStream`) with the provider's HTTP `status` and its response headers of interest
    (`x-request-id`, `openai-*`, `x-ratelimit-*`, `retry-after*`, `content-type`)."""

    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)


class OpenAICompatProvider:
    def __init__(
        self,
        provider: CloudProvider,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        env: Mapping[str, str] = os.environ,
        clock: Callable[[], float] = time.time,
        on_headers: Callable[[str, Mapping[str, str]], None] | None = None,
    ) -> None:
        self._provider = provider
        self._env = env
        self._clock = clock  # wall time: the `created` of translated replies
        self._on_headers = on_headers
        self._client = ProviderClient(provider.base_url, provider.timeout_s, transport)

    @property
    def name(self) -> str:
        return self._provider.name

    @property
    def config(self) -> CloudProvider:
        return self._provider

    def __repr__(self) -> str:
        return f"OpenAICompatProvider(name={self.name!r}, base_url={self._provider.base_url!r})"

    async def __aenter__(self) -> OpenAICompatProvider:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()

    async def chat(
        self, alias: str, body: dict[str, Any], request_id: str, *, extra_headers: Mapping[str, str] | None = None
    ) -> ProviderReply:
        """Send one chat completion; raises a `RequestError` for anything before the first
        byte of a streamed reply (and the stream's iterator raises `UpstreamError` after)."""
        payload = {k: v for k, v in body.items() if k in CHAT_FIELDS or (k in PREFILL_FIELDS and isinstance(v, bool))}
        return await self._post("chat/completions", alias, payload, request_id, extra_headers)

    async def completions(
        self, alias: str, body: dict[str, Any], request_id: str, *, extra_headers: Mapping[str, str] | None = None
    ) -> ProviderReply:
        """Send one legacy completion (`POST completions`, a /v1/completions request that bursts); errors as
        `chat`'s."""
        payload = {k: v for k, v in body.items() if k in COMPLETION_FIELDS}
        return await self._post("completions", alias, payload, request_id, extra_headers)

    async def _post(
        self,
        path: str,
        alias: str,
        payload: dict[str, Any],
        request_id: str,
        extra_headers: Mapping[str, str] | None,
    ) -> ProviderReply:
        payload["model"] = self._model_for(alias)
        key = self._api_key()
        redact = _redactor(key)
        stream = payload.get("stream") is True
        headers = {k.lower(): v for k, v in (extra_headers or {}).items() if k.lower() in FORWARDED_HEADERS}
        headers[hdr.REQUEST_ID] = request_id
        headers["accept"] = "text/event-stream" if stream else "application/json"
        if key:
            headers["authorization"] = f"Bearer {key}"
        request = self._client.build("POST", path, json_body=payload, headers=headers)
        response = await self._send(request, redact)
        try:
            return await self._reply(response, stream, redact)
        except BaseException:
            await response.aclose()
            raise

    async def probe(self) -> None:
        """Liveness (health L1): `GET models` with our key. Returns when the provider answers
        2xx; raises what `chat` would (a 401 is `provider_auth_failed`, so a wrong key is found
        without any traffic)."""
        key = self._api_key()
        redact = _redactor(key)
        headers = {"authorization": f"Bearer {key}"} if key else {}
        response = await self._send(self._client.build("GET", "models", headers=headers), redact)
        content = await self._read(response, error=True)  # only an error's start is ever read
        if not 200 <= response.status_code < 300:
            raise self._status_error(response.status_code, response.headers, content, redact)

    async def _send(self, request: httpx.Request, redact: Callable[[str], str]) -> httpx.Response:
        """Send and return once the status line arrived; transport failures become errors here."""
        try:
            response = await self._client.send(request)
        except httpx.TimeoutException as exc:
            message = f"cloud provider {self.name!r} did not answer within {self._provider.timeout_s:g} s"
            raise TargetUnavailable(f"{message} ({type(exc).__name__})", code=ErrorCode.PROVIDER_TIMEOUT) from None
        except httpx.RequestError as exc:
            detail = redact(str(exc))[:_MAX_DETAIL]
            message = f"cloud provider {self.name!r} is unreachable ({type(exc).__name__}: {detail})"
            raise TargetUnavailable(message, code=ErrorCode.PROVIDER_UNREACHABLE) from None
        if (
            self._on_headers is not None
        ):  # rate-limit headers feed the provider's quota (serve_apps/resilience/state.py)
            try:
                self._on_headers(self.name, response.headers)
            except Exception:  # bookkeeping never fails a request
                log.exception("cloud provider %s: its response headers could not be read", self.name)
        return response

    def _status_error(
        self, status: int, headers: Mapping[str, str], content: bytes, redact: Callable[[str], str]
    ) -> RequestError:
        return status_error(self.name, status, headers, content, redact)

    async def _reply(self, response: httpx.Response, stream: bool, redact: Callable[[str], str]) -> ProviderReply:
        status = response.status_code
        headers = kept_headers(response.headers)
        if not 200 <= status < 300:
            error = self._status_error(status, response.headers, await self._read(response, error=True), redact)
            log.info("cloud provider %s answered HTTP %s (%s)", self.name, status, error.code)
            raise error
        content_type = response.headers.get("content-type", "")
        if stream:
            if not content_type.startswith("text/event-stream"):
                await self._read(response, error=True)
                message = f"cloud provider {self.name!r} answered a stream request with {content_type or 'no type'}"
                raise UpstreamError(message, code=ErrorCode.PROVIDER_MALFORMED)
            events = ProviderEventStream(response, self.name, redact, max_bytes=self._provider.max_reply_bytes)
            return ProviderReply(status=status, headers=headers, chunks=events)
        content = await self._read(response)
        body = loads(content)
        if isinstance(body, dict) and "error" in body:
            detail = redact(_error_detail(content)[0])[:_MAX_DETAIL]
            raise UpstreamError(f"cloud provider {self.name!r} failed: {detail}", code=ErrorCode.PROVIDER_ERROR)
        if not isinstance(body, dict) or not isinstance(body.get("choices"), list):
            message = f"cloud provider {self.name!r} sent a body that is not a completion (HTTP {status})"
            raise UpstreamError(message, code=ErrorCode.PROVIDER_MALFORMED)
        return ProviderReply(status=status, headers=headers, body=body)

    async def _read(self, response: httpx.Response, *, error: bool = False) -> bytes:
        """The body within `max_reply_bytes` (`provider_reply_too_large` past it); with `error`, only the
        first ERROR_BODY_BYTES of it. The response is closed either way."""
        try:
            if error:
                return await read_prefix(response, ERROR_BODY_BYTES)
            return await read_body(response, self._provider.max_reply_bytes, self.name)
        except httpx.RequestError as exc:
            message = f"cloud provider {self.name!r}: the connection failed while reading the response"
            raise UpstreamError(f"{message} ({type(exc).__name__})", code=ErrorCode.PROVIDER_CUT) from None
        finally:
            await response.aclose()

    def _model_for(self, alias: str) -> str:
        model = self._provider.models.get(alias)
        if model is None:
            known = ", ".join(sorted(self._provider.models)) or "none"
            message = f"cloud provider {self.name!r} has no model for alias {alias!r} (it maps: {known})"
            raise ModelNotFound(message, param="model")
        return provider_model_name(model)

    def _api_key(self) -> str | None:
        variable = self._provider.api_key_env
        if variable is None:
            return None
        key = self._env.get(variable)
        if not key:
            log.warning("cloud provider %s: environment variable %s (its API key) is not set", self.name, variable)
            message = f"cloud provider {self.name!r} has no API key configured"
            raise TargetUnavailable(message, code=ErrorCode.PROVIDER_NOT_CONFIGURED)
        return key


def status_error(
    provider: str, status: int, headers: Mapping[str, str], content: bytes, redact: Callable[[str], str]
) -> RequestError:
    """The spillover error for a provider's non-2xx answer."""
    detail, param = _error_detail(content)
    detail = redact(detail)[:_MAX_DETAIL]
    who = f"cloud provider {provider!r}"
    if status == 429:
        return ProviderRateLimited(f"{who} is rate limiting (HTTP 429): {detail}", retry_after_s=retry_after_s(headers))
    if status in (401, 403):
        message = f"{who} refused our credentials (HTTP {status}); check its API key"
        return UpstreamError(message, code=ErrorCode.PROVIDER_AUTH_FAILED)
    if status == 408:
        return TargetUnavailable(f"{who} timed out (HTTP 408): {detail}", code=ErrorCode.PROVIDER_TIMEOUT)
    if context_exceeded(status, content):
        return ProviderContextExceeded(f"{who} says the prompt does not fit its context window: {detail}", param=param)
    if 400 <= status < 500:
        message = f"{who} rejected the request (HTTP {status}): {detail}"
        return ProviderRejected(message, status_code=status, param=param)
    return UpstreamError(f"{who} failed (HTTP {status}): {detail}", code=ErrorCode.PROVIDER_ERROR)


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    """Seconds from `retry-after-ms` or `retry-after` (delta-seconds; an HTTP date gives None)."""
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            value = float(raw) / scale
        except ValueError:
            continue
        if math.isfinite(value) and value >= 0:
            return value
    return None


def kept_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {
        name.lower(): value
        for name, value in headers.items()
        if name.lower() in KEPT_HEADERS or name.lower().startswith(KEPT_HEADER_PREFIXES)
    }


def _error_detail(content: bytes) -> tuple[str, str | None]:
    """The provider's error message and param, from an OpenAI error body or plain text."""
    text = content.decode("utf-8", errors="replace").strip()
    data = loads(text)
    if data is None:
        return (text[:_MAX_DETAIL] or "no details"), None
    error = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(error, dict):
        message = error.get("message") or error.get("detail") or json.dumps(error)[:_MAX_DETAIL]
        param = error.get("param")
        return str(message), param if isinstance(param, str) else None
    return str(error), None


def _redactor(key: str | None) -> Callable[[str], str]:
    if not key:
        return lambda text: text
    return lambda text: text.replace(key, "[redacted]")
