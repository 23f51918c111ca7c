"""Which provider 400s are facts about the target rather than the request.

A provider that answers "the prompt does not fit" for a prompt the gateway routed there (the
configured window said it would) has a smaller real window than configured, or counts tokens
differently: another target with a larger window may well take the same request. Recognised, and
only these (every other 400 still goes back to the client):

    OpenAI-compatible   400, `error.code` == "context_length_exceeded"
    Messages API        400 `invalid_request_error` whose message starts "prompt is too long"
"""

from __future__ import annotations

from typing import Any

from serve_apps.providers.bounded import loads

ANTHROPIC_TOO_LONG = "prompt is too long"


def context_exceeded(status: int, content: bytes) -> bool:
    """Whether a provider's error answer says the prompt does not fit the model's context window."""
    if status != 400:
        return False
    data: Any = loads(content.decode("utf-8", errors="replace"))
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict):
        return False
    if error.get("code") == "context_length_exceeded":
        return True
    message = error.get("message")
    return (
        error.get("type") == "invalid_request_error"
        and isinstance(message, str)
        and message.lower().startswith(ANTHROPIC_TOO_LONG)
    )
