"""`gateway.direct_port` on the real stack: the gateway replica's own listener (serve_apps/http/direct.py), called
with the official openai client without crossing Serve's proxy — the same answers, headers, streams and limits
as through the proxy's port (tests/integration/conftest.py sets the port)."""

from __future__ import annotations

import openai
import pytest

from tests import http_attacks as attack
from tests.integration.conftest import HTTP_LIMITS, SMOL, Stack

pytestmark = pytest.mark.integration
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
WITHIN_S = 3 * max(HTTP_LIMITS["header_timeout_s"], HTTP_LIMITS["body_timeout_s"]) + 15


def _direct(stack: Stack) -> tuple[str, int]:
    port = stack.config.gateway.direct_port
    assert port is not None
    return stack.config.gateway.host, port


def test_the_direct_port_answers_as_the_proxy_does(stack: Stack) -> None:
    host, port = _direct(stack)
    direct = openai.OpenAI(base_url=f"http://{host}:{port}/v1", api_key="not-needed", timeout=120, max_retries=0)
    proxied = openai.OpenAI(base_url=stack.openai_base, api_key="not-needed", timeout=120, max_retries=0)
    raw = direct.chat.completions.with_raw_response.create(model=SMOL, messages=FRANCE, temperature=0, max_tokens=30)
    answer = raw.parse().choices[0].message.content or ""
    assert "Paris" in answer and raw.headers["x-spillover-route"] == "local"
    assert len(raw.headers.get_list("x-request-id")) == 1
    via_proxy = proxied.chat.completions.create(model=SMOL, messages=FRANCE, temperature=0, max_tokens=30)
    assert via_proxy.choices[0].message.content == answer
    stream = direct.chat.completions.create(model=SMOL, messages=FRANCE, temperature=0, max_tokens=30, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == answer
    assert {m.id for m in direct.models.list().data} == set(stack.config.served_names)


def test_the_direct_port_keeps_the_http_limits(stack: Stack) -> None:
    outcome = attack.huge_header(*_direct(stack), within_s=WITHIN_S)
    assert outcome.refused and outcome.status in (None, 431), outcome
    outcome = attack.slow_loris(*_direct(stack), every_s=1.0, within_s=WITHIN_S)
    assert outcome.refused and outcome.status in (None, 408), outcome
