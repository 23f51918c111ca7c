"""Adapters to cloud providers. Each translates its library's and provider's errors into
`router.errors` classes at one choke point.

    openai_compat.py   OpenAICompatProvider: any OpenAI-compatible chat API over httpx
    sse.py             ProviderEventStream: a provider's SSE reply as complete events
    anthropic.py       AnthropicProvider: the Anthropic Messages API (`type: anthropic`)
    anthropic_wire.py  OpenAI chat <-> Messages translation, pure
"""

from __future__ import annotations

from typing import Any

from cluster.config.cloud import CloudProvider
from serve_apps.providers.anthropic import AnthropicProvider
from serve_apps.providers.openai_compat import OpenAICompatProvider, ProviderReply
from serve_apps.providers.sse import ProviderEventStream


def provider_for(config: CloudProvider, **options: Any) -> OpenAICompatProvider:
    """The adapter for a configured provider's `type` (options: transport, env, clock, on_headers)."""
    if config.type == "anthropic":
        return AnthropicProvider(config, **options)
    return OpenAICompatProvider(config, **options)


__all__ = ["AnthropicProvider", "OpenAICompatProvider", "ProviderEventStream", "ProviderReply", "provider_for"]

# The modules of this wing the rest of serve_apps/ may import: its doors (tests/unit/test_wing_doors.py).
DOORS: tuple[str, ...] = ("__init__",)
