"""The gateway's ASGI app over a local `FakeEngine`, served with given `gateway.http_limits`: what the HTTP-limit
tests put behind a real uvicorn (tests/unit/test_http_limits.py, tests/unit/test_direct_listener.py)."""

from __future__ import annotations

from cluster.config.gateway import HttpLimits
from serve_apps.dispatch.interfaces import LocalDispatch
from serve_apps.gateway_parts import EdgeSettings
from serve_apps.http.surface import GatewayHTTP, ServedModel
from tests.fakes import FakeEngine


def gateway_app(limits: HttpLimits | None, answer: str | None = None) -> object:
    """Model `small` (2,048 tokens) served locally by a FakeEngine (`answer`, else its default)."""
    engine = FakeEngine() if answer is None else FakeEngine(answer=answer)
    return GatewayHTTP(
        engine,
        [ServedModel("small", "llama", "cpu", 2048)],
        LocalDispatch(engine),
        created=1,
        edge=EdgeSettings(http_limits=limits),
    ).app
