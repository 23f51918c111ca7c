"""Which conversation a request belongs to: the session id, from headers or the body. Pure.

Only an explicit name makes a conversation, first found wins:

    1. header `x-spillover-session`
    2. body `metadata.session_id`

`user` (OpenAI's end-user id) and `prompt_cache_key` (OpenAI's prefix-cache routing hint) keep their
OpenAI meaning and never name a session: two end users of one tenant with the same `user` or cache
key are two conversations, and share no pin, anchor or stored history.

The header's value is 1-128 printable ASCII characters; anything else is a 400 `invalid_session`
(never silently ignored: a client that names a session and loses it would see its conversation
wander between models). `metadata.session_id` is a string of at most 4,096 characters (else 400
`invalid_session` naming the field), "" names no session, and a value longer than 128 characters
or not ASCII is keyed by its SHA-256.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from router import headers as hdr
from router.error_codes import ErrorCode
from router.errors import InvalidRequest

MAX_SESSION_ID = 128
MAX_BODY_ID = 4096
SOURCES = (hdr.SESSION, "metadata.session_id")
KEY_SEPARATOR = "\x1f"


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
            code=ErrorCode.INVALID_SESSION,
        )
    return value


def _body_id(value: Any, source: str) -> str | None:
    """A body field naming a session: a string (else 400); "" names none; a long or non-ASCII one
    is keyed by its SHA-256 (the client's value is never refused for its length)."""
    if not isinstance(value, str) or len(value) > MAX_BODY_ID:
        raise InvalidRequest(
            f"{source} must be a string of at most {MAX_BODY_ID} characters",
            param=source,
            code=ErrorCode.INVALID_SESSION,
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
    value = metadata.get("session_id") if isinstance(metadata, Mapping) else None
    if value is not None and (valid := _body_id(value, "metadata.session_id")) is not None:
        return SessionId(valid, "metadata.session_id")
    return None


def pin_key(tenant: str | None, model: str, session: str) -> str:
    """Pins are per tenant and per model alias: one tenant can never read or move another's."""
    return KEY_SEPARATOR.join((tenant or "", model, session))


def tenant_of_key(key: str) -> str:
    """The tenant a pin key belongs to ("" without auth, or for a key pin_key did not make): the session
    stores evict per tenant."""
    tenant, separator, _ = key.partition(KEY_SEPARATOR)
    return tenant if separator else ""
