"""Adapters to cloud providers. Each translates its library's and provider's errors into
`router.errors` classes at one choke point.

    openai_compat.py  OpenAICompatProvider: any OpenAI-compatible chat API over httpx
    sse.py            ProviderEventStream: a provider's SSE reply as complete events
"""

from serve_apps.providers.openai_compat import OpenAICompatProvider, ProviderReply
from serve_apps.providers.sse import ProviderEventStream

__all__ = ["OpenAICompatProvider", "ProviderEventStream", "ProviderReply"]
