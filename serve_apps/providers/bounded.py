"""Reading a provider's reply within `cloud.providers[].max_reply_bytes`, and its JSON without a 500.

A provider is a remote server the gateway does not control: a 1 GiB body, a line or an SSE event that
never ends, or JSON nested past Python's recursion limit must not exhaust the gateway. So:

    `read_body`    the whole body, refused at once when its `content-length` is over the bound and
                   at the chunk that crosses it otherwise (bytes counted after content decoding, so a
                   compressed bomb counts at its real size): `provider_reply_too_large`
    `read_prefix`  the first `ERROR_BODY_BYTES` of an error answer (only its start is ever quoted)
    `BoundedLines` a streamed reply's lines (LF, CRLF or CR, as SSE allows), the whole stream held to
                   the same bound: no line or event can grow past it, and the stream ends there with
                   `provider_reply_too_large`
    `loads`        json.loads of a reply; JSON nested deeper than a request may be (64), or holding a
                   lone UTF-16 surrogate that no UTF-8 answer can carry, is None like any other
                   malformed body: the adapters answer `provider_malformed`

Both errors are `UpstreamError`s of the PROTOCOL class (router/resilience/failure.py): the request fails over to
the next capable target, the target's breaker counts a failure, and it is not retried on the same target.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

from router.error_codes import ErrorCode
from router.errors import UpstreamError
from router.request.openai_request import MAX_DEPTH, shape_error

ERROR_BODY_BYTES = 64 * 1024  # of a non-2xx answer: its message and code are at the start


def too_large(provider: str, limit: int) -> UpstreamError:
    return UpstreamError(
        f"cloud provider {provider!r} sent a reply larger than its max_reply_bytes = {limit} bytes (dropped)",
        code=ErrorCode.PROVIDER_REPLY_TOO_LARGE,
    )


def _declared(response: httpx.Response) -> int | None:
    text = response.headers.get("content-length", "").strip()
    return int(text) if text.isdigit() and len(text) <= 20 else None


async def read_body(response: httpx.Response, limit: int, provider: str) -> bytes:
    """The decoded body, at most `limit` bytes (UpstreamError `provider_reply_too_large` past it).
    Transport errors propagate as httpx raises them; the caller closes the response."""
    declared = _declared(response)
    if declared is not None and declared > limit:
        raise too_large(provider, limit)
    parts: list[bytes] = []
    seen = 0
    async for chunk in response.aiter_bytes():
        seen += len(chunk)
        if seen > limit:
            raise too_large(provider, limit)
        parts.append(chunk)
    return b"".join(parts)


async def read_prefix(response: httpx.Response, limit: int) -> bytes:
    """At most the first `limit` decoded bytes (an error body: only its start is ever quoted); the rest is
    never read. Transport errors propagate; the caller closes the response."""
    parts: list[bytes] = []
    seen = 0
    async for chunk in response.aiter_bytes():
        parts.append(chunk[: limit - seen])
        seen += len(parts[-1])
        if seen >= limit:
            break
    return b"".join(parts)


class BoundedLines:
    """The text lines of a streamed reply (without their line ends), `limit` bytes for the whole stream."""

    def __init__(self, response: httpx.Response, limit: int, provider: str) -> None:
        self._response = response
        self._limit = limit
        self._provider = provider
        self.seen = 0  # decoded bytes read so far

    async def __call__(self) -> AsyncIterator[str]:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        partial: list[str] = []  # the current line's pieces: joined once, so a long line stays linear
        after_cr = False  # the last piece ended with CR: a LF starting the next one belongs to it
        async for chunk in self._response.aiter_bytes():
            self.seen += len(chunk)
            if self.seen > self._limit:
                raise too_large(self._provider, self._limit)
            text = decoder.decode(chunk)
            if after_cr and text.startswith("\n"):
                text = text[1:]
            after_cr = text.endswith("\r")
            pieces = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
            for piece in pieces[:-1]:
                partial.append(piece)
                yield "".join(partial)
                partial = []
            if pieces[-1]:
                partial.append(pieces[-1])
        rest = "".join(partial) + decoder.decode(b"", final=True)
        if rest:
            yield rest


def loads(content: bytes | str) -> Any:
    """The reply's JSON, or None when it is not JSON, is nested deeper than a request may be, or holds a
    lone UTF-16 surrogate (it could not be sent on as UTF-8: the client's answer would be a 500)."""
    try:
        value = json.loads(content)
    except (ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError, nesting past the limit
        return None
    return None if shape_error(value, MAX_DEPTH) is not None else value
