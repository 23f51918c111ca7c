"""An async load generator for any OpenAI-compatible base URL (the gateway, Ray's ingress, vLLM,
the cloud simulator), over `httpx.AsyncClient`.

Every request is a streamed chat completion (`stream: true`, `stream_options.include_usage`), so
one request measures (see `RequestResult`): TTFT at the first content or tool-call chunk, e2e at
`[DONE]`, output tokens from `usage.completion_tokens` (else the number of content chunks),
prompt / cached tokens from `usage`, the HTTP status, an error code, and the gateway's
`x-spillover-route` / `x-spillover-target` headers.

Schedules
    run_closed   N workers; each sends its next request when its previous one ended. The first
                 `warmup` requests run first (at most N at once) and are marked `warmup`.
    run_open     requests start at given offsets (e.g. `workload.poisson_arrivals`), whatever
                 is still in flight.

With `request_id_prefix` every request carries `x-request-id: <prefix>-<item index>`, so a result can be
looked up in the gateway's decision records (`GET /v1/spillover/decisions/{request_id}`).

Bounds: the number of requests is the number of items; `time_limit_s` ends a level (no new
requests, the ones in flight are cancelled and recorded as `cancelled`); `request_timeout_s`
bounds one request (`timeout`). The client talks only to the base URL it was made for: no
redirects, no proxies from the environment (`make_client`). Clock, sleep and the HTTP transport
are injected (tests use `httpx.ASGITransport` / `httpx.MockTransport`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import httpx

from bench.load.progress import NullProgress, ProgressSink
from bench.load.request_result import CANCELLED, RequestResult
from bench.load.workload import WorkItem
from router import headers as hdr

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]
ROUTE_HEADER = hdr.ROUTE
TARGET_HEADER = hdr.TARGET


class BadBaseUrl(ValueError):
    """A base URL the load generator will not use."""


class AuthRequired(Exception):
    """The server answered 401/403: it needs (another) API key."""


def check_base_url(url: str) -> str:
    """`http(s)://host[:port][/path]` without query or fragment, trailing slash removed."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadBaseUrl(f"not an http(s) base URL: {url!r} (expected e.g. http://127.0.0.1:8000/v1)")
    if parts.query or parts.fragment:
        raise BadBaseUrl(f"a base URL has no query or fragment: {url!r}")
    return url.strip().rstrip("/")


def make_client(
    base_url: str,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    api_key: str | None = None,
    connect_timeout_s: float = 10.0,
    read_timeout_s: float = 300.0,
) -> httpx.AsyncClient:
    """An `AsyncClient` bound to `base_url`: no connection-count cap (the schedule bounds
    concurrency), no redirects, no environment proxies."""
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.AsyncClient(
        base_url=check_base_url(base_url) + "/",
        transport=transport,
        headers=headers,
        timeout=httpx.Timeout(read_timeout_s, connect=connect_timeout_s),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
        follow_redirects=False,
        trust_env=False,
    )


async def served_models(client: httpx.AsyncClient) -> list[str] | None:
    """The model ids of `GET models`, or None when the server has no such list.
    Connection errors propagate (`httpx.HTTPError`): the URL is not reachable; 401/403 raise
    `AuthRequired`."""
    response = await client.get("models")
    if response.status_code in (401, 403):
        raise AuthRequired(f"{response.status_code} {error_code(response.content, response.status_code)}")
    if response.status_code != 200:
        return None
    try:
        data = response.json().get("data")
        return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
    except (ValueError, AttributeError, TypeError):
        return None


class LoadGenerator:
    def __init__(
        self,
        client: httpx.AsyncClient,
        model: str,
        *,
        clock: Clock = time.perf_counter,
        sleep: Sleep = asyncio.sleep,
        progress: ProgressSink | None = None,
        extra_body: Mapping[str, Any] | None = None,
        request_timeout_s: float = 300.0,
        request_id_prefix: str | None = None,
    ) -> None:
        self._client = client
        self._request_id_prefix = request_id_prefix
        self._model = model
        self._clock = clock
        self._sleep = sleep
        self._progress = progress or NullProgress()
        self._extra_body = dict(extra_body or {})
        self._request_timeout_s = request_timeout_s
        self._origin = clock()

    def body(self, item: WorkItem) -> dict[str, Any]:
        return {
            "model": self._model,
            "messages": [dict(m) for m in item.messages],
            "max_tokens": item.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            **self._extra_body,
        }

    async def run_closed(
        self,
        items: Sequence[WorkItem],
        concurrency: int,
        *,
        warmup: int = 0,
        time_limit_s: float | None = None,
        label: str = "",
    ) -> list[RequestResult]:
        """Send `items` with `concurrency` workers; the first `warmup` of them as warm-up."""
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        deadline = None if time_limit_s is None else self._clock() + time_limit_s
        results: list[RequestResult] = []
        self._progress.start(label or f"c={concurrency}", len(items))
        try:
            for batch, is_warmup in ((items[:warmup], True), (items[warmup:], False)):
                pending = iter(batch)

                async def worker(pending: Any = pending, is_warmup: bool = is_warmup) -> None:
                    for item in pending:
                        if deadline is not None and self._clock() >= deadline:
                            return
                        results.append(await self._bounded(item, is_warmup, deadline))

                await asyncio.gather(*(worker() for _ in range(min(concurrency, len(batch)))))
        finally:
            self._progress.finish()
        return results

    async def run_open(
        self,
        items: Sequence[WorkItem],
        arrivals: Sequence[float],
        *,
        time_limit_s: float | None = None,
        label: str = "open",
    ) -> list[RequestResult]:
        """Start items[i] at arrivals[i] seconds from now, regardless of what is in flight."""
        if len(arrivals) > len(items):
            raise ValueError(f"{len(arrivals)} arrivals but only {len(items)} requests")
        start = self._clock()
        deadline = None if time_limit_s is None else start + time_limit_s
        tasks: list[asyncio.Task[RequestResult]] = []
        self._progress.start(label, len(arrivals))
        try:
            for item, offset in zip(items, arrivals, strict=False):
                if deadline is not None and start + offset >= deadline:
                    break
                wait = start + offset - self._clock()
                if wait > 0:
                    await self._sleep(wait)
                tasks.append(asyncio.create_task(self._bounded(item, False, deadline)))
            return list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:
                task.cancel()
            self._progress.finish()

    async def _bounded(self, item: WorkItem, warmup: bool, deadline: float | None) -> RequestResult:
        limit, by_level = self._request_timeout_s, False
        if deadline is not None and deadline - self._clock() < limit:
            limit, by_level = max(0.0, deadline - self._clock()), True
        start = self._now()
        try:
            result = await asyncio.wait_for(self.send(item, warmup=warmup), timeout=limit)
        except TimeoutError:
            error = CANCELLED if by_level else "timeout"
            result = RequestResult(item.index, start, self._now() - start, error=error, warmup=warmup)
        self._progress.advance(result.ok)
        return result

    async def send(
        self, item: WorkItem, *, warmup: bool = False, headers: Mapping[str, str] | None = None
    ) -> RequestResult:
        """One streamed chat completion, measured; `headers` are added to the client's for this request."""
        start = self._now()
        stream = _StreamState()
        status: int | None = None
        answered: Mapping[str, str] = {}
        error: str | None
        if self._request_id_prefix is not None:
            headers = {**(headers or {}), hdr.REQUEST_ID: f"{self._request_id_prefix}-{item.index}"}
        try:
            request = self._client.stream("POST", "chat/completions", json=self.body(item), headers=headers)
            async with request as response:
                status, answered = response.status_code, response.headers
                if status != 200:
                    error = error_code(await response.aread(), status)
                else:
                    error = await stream.read(response, self._now)
        except httpx.TimeoutException:
            error = "timeout"
        except httpx.ConnectError:
            error = "connect_error"
        except (httpx.RemoteProtocolError, httpx.ReadError):
            error = "stream_cut"
        except httpx.HTTPError:
            error = "http_error"
        end = self._now()
        usage = stream.usage
        completion = usage.get("completion_tokens")
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        return RequestResult(
            index=item.index,
            start_s=start,
            e2e_s=end - start,
            ttft_s=None if stream.first_token_at is None else stream.first_token_at - start,
            output_tokens=completion if isinstance(completion, int) else stream.content_chunks,
            prompt_tokens=_int_or_none(usage.get("prompt_tokens")),
            cached_tokens=_int_or_none(cached),
            status=status,
            error=error,
            route=answered.get(ROUTE_HEADER),
            target=answered.get(TARGET_HEADER),
            warmup=warmup,
        )

    def _now(self) -> float:
        return self._clock() - self._origin


class _StreamState:
    """What the SSE stream of one chat completion said so far."""

    def __init__(self) -> None:
        self.first_token_at: float | None = None
        self.content_chunks = 0
        self.usage: dict[str, Any] = {}

    async def read(self, response: httpx.Response, now: Clock) -> str | None:
        """Consume the stream; the error code, or None when it ended with `[DONE]`."""
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return None
            try:
                chunk = json.loads(data)
            except ValueError:
                return "malformed"
            if not isinstance(chunk, dict):
                return "malformed"
            if "error" in chunk:
                err = chunk["error"]
                code = err.get("code") if isinstance(err, dict) else None
                return code if isinstance(code, str) and code else "stream_error"
            if isinstance(chunk.get("usage"), dict):
                self.usage = chunk["usage"]
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") if isinstance(choice, dict) else None
                if isinstance(delta, dict) and _has_output(delta):
                    if self.first_token_at is None:
                        self.first_token_at = now()
                    self.content_chunks += 1
        return "stream_cut"


def _has_output(delta: dict[str, Any]) -> bool:
    return bool(delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"))


def error_code(body: bytes, status: int) -> str:
    """The OpenAI error body's `code`, else `http_<status>`."""
    try:
        err = json.loads(body).get("error")
        code = err.get("code") if isinstance(err, dict) else None
    except (ValueError, AttributeError):
        code = None
    return code if isinstance(code, str) and code else f"http_{status}"


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
