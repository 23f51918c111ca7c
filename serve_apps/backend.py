"""What the gateway needs from whatever serves a model: the `ModelBackend` protocol.

The gateway's HTTP layer talks only to this protocol. In production it is
`serve_apps.local_backend.ServeHandleBackend` (Ray Serve DeploymentHandles to vLLM
LLMServer deployments); unit tests use a fake that implements the same protocol.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from router.openai_request import Kind


@dataclass(frozen=True)
class BackendReply:
    """Exactly one of `body` (a complete JSON response) or `chunks` (SSE text) is set.

    `chunks` yields complete SSE events (`data: {...}\\n\\n`), the last being
    `data: [DONE]\\n\\n`.
    """

    body: dict[str, Any] | None = None
    chunks: AsyncIterator[str] | None = None


class ModelBackend(Protocol):
    async def call(self, alias: str, kind: Kind, body: dict[str, Any], request_id: str) -> BackendReply:
        """Run one request. Raises a `router.errors.RequestError` for anything the
        client should hear about before the first byte is sent."""
        ...

    async def check_health(self, alias: str, timeout_s: float) -> str | None:
        """None when the model's deployment is healthy, else a short reason."""
        ...
