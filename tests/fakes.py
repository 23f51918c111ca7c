"""Fakes shared by the unit tests, one of each: a clock, a local model engine, a cloud provider."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from router.errors import ProviderRejected, RequestError, UpstreamError
from router.request.openai_request import Kind
from serve_apps.backend import BackendReply


class FakeClock:
    """A clock the test sets or advances by hand: call it for the time (what the code under test
    is given as `clock`), read or assign `.now`."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


Call = tuple[str, str, dict[str, Any], str]  # alias, kind, body, request id
DONE = "data: [DONE]\n\n"


def completion(
    model: str, content: str, usage: dict[str, int] | None = None, finish_reason: str | None = None
) -> dict[str, Any]:
    """An OpenAI chat completion answering `content`, as vLLM's server and cloud providers send it."""
    message = {"role": "assistant", "content": content}
    choice: dict[str, Any] = {"index": 0, "message": message}
    if finish_reason is not None:
        choice["finish_reason"] = finish_reason
    body: dict[str, Any] = {"object": "chat.completion", "model": model, "choices": [choice]}
    if usage is not None:
        body["usage"] = usage
    return body


def chunk_event(model: str, content: str) -> str:
    """One SSE event of an OpenAI chat completion stream carrying `content` as its delta."""
    chunk = {
        "object": "chat.completion.chunk",
        "model": model,
        "choices": [{"index": 0, "delta": {"content": content}}],
    }
    return f"data: {json.dumps(chunk)}\n\n"


def usage_event(model: str, usage: dict[str, int]) -> str:
    """The last chunk of a stream asked for `stream_options.include_usage` (OpenAI, vLLM): no choices."""
    chunk = {"object": "chat.completion.chunk", "model": model, "choices": [], "usage": usage}
    return f"data: {json.dumps(chunk)}\n\n"


def wants_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def delta(event: str) -> str:
    """The content delta of an SSE event `chunk_event` made."""
    return str(json.loads(event.removeprefix("data: "))["choices"][0]["delta"]["content"])


class FakeEngine:
    """A local model as the gateway reaches it (`ModelBackend`, serve_apps/backend.py), answering
    like vLLM's OpenAI server: a chat completion whose message is `answer` (with `usage` when given)
    or, for `"stream": true`, the answer in two chunk events (then, when the request asked for
    `stream_options.include_usage` and `usage` is given, the usage chunk) and `data: [DONE]`. `fail` is raised
    before the first byte (a replica that is gone), `fail_mid_stream` after the first event (one
    that dies while streaming); `unhealthy[alias]` is the reason its health check reports;
    `finish_reason` is set on complete answers when given (vLLM always sends one: "length" when the
    answer ran into max_tokens)."""

    def __init__(self, answer: str = "Paris", usage: dict[str, int] | None = None) -> None:
        self.answer = answer
        self.usage = usage
        self.finish_reason: str | None = None
        self.calls: list[Call] = []
        self.fail: Exception | None = None
        self.fail_mid_stream: Exception | None = None
        self.unhealthy: dict[str, str] = {}

    async def call(self, alias: str, kind: Kind, body: dict[str, Any], request_id: str) -> BackendReply:
        self.calls.append((alias, kind, body, request_id))
        if self.fail is not None:
            raise self.fail
        if body.get("stream"):
            return BackendReply(chunks=self._chunks(alias, wants_usage(body)))
        return BackendReply(body=completion(alias, self.answer, self.usage, self.finish_reason))

    async def _chunks(self, model: str, with_usage: bool = False) -> AsyncIterator[str]:
        half = len(self.answer) // 2
        yield chunk_event(model, self.answer[:half])
        if self.fail_mid_stream is not None:
            raise self.fail_mid_stream
        yield chunk_event(model, self.answer[half:])
        if with_usage and self.usage is not None:
            yield usage_event(model, self.usage)
        yield DONE

    async def check_health(self, alias: str, timeout_s: float) -> str | None:
        return self.unhealthy.get(alias)


class FakeProvider:
    """A cloud provider as the dispatcher and the prober reach it (`CloudBackend`,
    serve_apps/backend.py; `probe` as serve_apps/resilience/prober.py asks): each call first raises the next
    of the `script`ed errors (as a failing provider answers one request after another), then answers
    like FakeEngine with the model `<name>/<alias>` (the provider's own name for the model). With
    `cut` a stream ends after its first event with the `UpstreamError` a dropped connection gives
    (serve_apps/providers/sse.py); `probe_error` is what its liveness probe raises. A stream sends
    the usage chunk when the request asked for `stream_options.include_usage` and `usage` is given
    (as OpenAI does); `stream_events`, when set, are the chunk events a stream sends instead of the
    answer's (e.g. tool-call deltas), before the usage chunk and `[DONE]`."""

    def __init__(
        self,
        name: str = "sim",
        answer: str = "ok",
        *,
        script: list[RequestError] | None = None,
        usage: dict[str, int] | None = None,
        probe_error: Exception | None = None,
    ) -> None:
        self.name = name
        self.answer = answer
        self.script = list(script or [])
        self.usage = usage
        self.probe_error = probe_error
        self.cut = False
        self.stream_events: list[str] | None = None
        self.calls: list[str] = []  # request ids
        self.bodies: list[dict[str, Any]] = []

    async def chat(self, alias: str, body: dict[str, Any], request_id: str) -> BackendReply:
        self.calls.append(request_id)
        self.bodies.append(body)
        if self.script:
            raise self.script.pop(0)
        model = f"{self.name}/{alias}"
        if body.get("stream"):
            return BackendReply(chunks=self._chunks(model, wants_usage(body)))
        return BackendReply(body=completion(model, self.answer, self.usage))

    async def _chunks(self, model: str, with_usage: bool = False) -> AsyncIterator[str]:
        events = self.stream_events if self.stream_events is not None else [chunk_event(model, self.answer)]
        for event in events[:1] if self.cut else events:
            yield event
        if self.cut:
            raise UpstreamError("connection lost mid-stream", code="provider_cut")
        if with_usage and self.usage is not None:
            yield usage_event(model, self.usage)
        yield DONE

    async def probe(self) -> None:
        if self.probe_error is not None:
            raise self.probe_error


class WordStreamProvider(FakeProvider):
    """A FakeProvider whose streams go word by word as the cloud simulator's and vLLM's do (a role
    chunk, one chunk per word, the finish chunk, the usage chunk with `stream_options.include_usage`,
    `[DONE]`). `cut_after` words in, a stream ends with the `UpstreamError` a dropped connection
    gives (serve_apps/providers/sse.py). A request ending in an assistant message with
    `continue_final_message: true` continues that prefill the way vLLM's chat API does — the words
    of `answer` after as many words as the prefill holds — or, with `prefill=False`, is refused with
    the 400 an API without that extension answers (ProviderRejected)."""

    def __init__(self, name: str, answer: str, *, cut_after: int | None = None, prefill: bool = True) -> None:
        super().__init__(name, answer)
        self.cut_after = cut_after
        self.prefill = prefill
        self.bodies: list[dict[str, Any]] = []

    async def chat(self, alias: str, body: dict[str, Any], request_id: str) -> BackendReply:
        self.bodies.append(body)
        words = self.answer.split(" ")
        pieces = [w if i == 0 else f" {w}" for i, w in enumerate(words)]
        messages = body.get("messages") or []
        if body.get("continue_final_message") is True and messages and messages[-1].get("role") == "assistant":
            if not self.prefill:
                self.calls.append(request_id)
                raise ProviderRejected("Unrecognized request argument supplied: continue_final_message")
            pieces = pieces[len(str(messages[-1].get("content") or "").split()) :]
        reply = await super().chat(alias, body, request_id)
        if reply.chunks is None:
            return reply
        options = body.get("stream_options")
        usage = isinstance(options, dict) and options.get("include_usage") is True
        return BackendReply(chunks=self._words(f"{self.name}/{alias}", pieces, usage))

    async def _words(self, model: str, pieces: list[str], usage: bool) -> AsyncIterator[str]:
        def event(delta: dict[str, Any], finish: str | None = None) -> str:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            chunk = {"id": self.name, "object": "chat.completion.chunk", "model": model, "choices": [choice]}
            return f"data: {json.dumps(chunk)}\n\n"

        yield event({"role": "assistant", "content": ""})
        for i, piece in enumerate(pieces):
            if self.cut_after is not None and i == self.cut_after:
                raise UpstreamError("connection lost mid-stream", code="provider_cut")
            yield event({"content": piece})
        yield event({}, "stop")
        if usage:
            counts = {"prompt_tokens": 10, "completion_tokens": len(pieces), "total_tokens": 10 + len(pieces)}
            yield f"data: {json.dumps({'id': self.name, 'choices': [], 'usage': counts})}\n\n"
        yield DONE
