"""Which conversation a request belongs to: the session id, from headers or the body. Pure.

Session id, first found wins:

    1. header `x-spillover-session`
    2. body `prompt_cache_key` (OpenAI's prefix-cache routing hint)
    3. body `metadata.session_id`
    4. body `user` (OpenAI's end-user id: one conversation per user)

The header's value is 1-128 printable ASCII characters; anything else is a 400 `invalid_session`
(never silently ignored: a client that names a session and loses it would see its conversation
wander between models). The body fields are OpenAI's own and keep their meaning: a string of at
most 4,096 characters (else 400 `invalid_session` naming the field), "" names no session, and a
value longer than 128 characters or not ASCII is keyed by its SHA-256.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from router import headers as hdr
from router.errors import InvalidRequest

MAX_SESSION_ID = 128
MAX_BODY_ID = 4096
SOURCES = (hdr.SESSION, "prompt_cache_key", "metadata.session_id", "user")


@dataclass(frozen=True)
class SessionId:
    value: str
    source: str  # one of SOURCES


def _header_id(value: str) -> str:
    value = value.strip()
    if not 1 <= len(value) <= MAX_SESSION_ID or not value.isascii() or not value.isprintable():
        raise InvalidRequest(
            f"{hdr.SESSION} names a session: 1-{MAX_SESSION_ID} printable ASCII characters",
            param=hdr.SESSION,
            code="invalid_session",
        )
    return value


def _body_id(value: Any, source: str) -> str | None:
    """An OpenAI body field used as a session id: a string (else 400); "" names none; a long or
    non-ASCII one is keyed by its SHA-256 (the client's value is never refused for its length)."""
    if not isinstance(value, str) or len(value) > MAX_BODY_ID:
        raise InvalidRequest(
            f"{source} must be a string of at most {MAX_BODY_ID} characters", param=source, code="invalid_session"
        )
    if not value:
        return None
    if len(value) <= MAX_SESSION_ID and value.isascii() and value.isprintable():
        return value
    return "sha256:" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def session_id_of(body: Mapping[str, Any], headers: Mapping[str, str]) -> SessionId | None:
    """The request's session (see the module docstring for the precedence); `headers` lower-case keys."""
    if (given := headers.get(hdr.SESSION)) is not None:
        return SessionId(_header_id(given), hdr.SESSION)
    metadata = body.get("metadata")
    found = {
        "prompt_cache_key": body.get("prompt_cache_key"),
        "metadata.session_id": metadata.get("session_id") if isinstance(metadata, Mapping) else None,
        "user": body.get("user"),
    }
    for source, value in found.items():
        if value is not None and (valid := _body_id(value, source)) is not None:
            return SessionId(valid, source)
    return None


def pin_key(tenant: str | None, model: str, session: str) -> str:
    """Pins are per tenant and per model alias: one tenant can never read or move another's."""
    return f"{tenant or ''}\x1f{model}\x1f{session}"
