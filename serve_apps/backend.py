"""What the gateway needs from whatever serves a model, and the one reply every backend returns.

`ModelBackend`: the local models, by alias (in production `serve_apps.engine.local_backend.ServeHandleBackend`,
Ray Serve DeploymentHandles to vLLM LLMServer deployments). `CloudBackend`: one cloud provider's chat
API (in production `serve_apps.providers.OpenAICompatProvider`). Both answer a `BackendReply`, so the
dispatcher, the output contract, the prober and the HTTP layer handle local and cloud answers alike.
Unit tests use the fakes of tests/fakes.py, which implement the same protocols.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from router.request.openai_request import Kind


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


class CloudBackend(Protocol):
    @property
    def name(self) -> str: ...

    async def chat(self, alias: str, body: dict[str, Any], request_id: str) -> BackendReply:
        """Run one chat completion on the provider's model for `alias`. Raises a
        `router.errors.RequestError` for anything before the first byte of the reply; a stream's
        iterator raises `UpstreamError` after it."""
        ...

    async def completions(self, alias: str, body: dict[str, Any], request_id: str) -> BackendReply:
        """Run one legacy completion (a /v1/completions request), errors as `chat`'s."""
        ...
