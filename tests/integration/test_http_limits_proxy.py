"""`gateway.http_limits` at Ray Serve's real HTTP proxy: hostile raw-socket clients against the stack's
proxy, which serves with serve_apps/http/limits.py's protocol (the job's environment carries the
callback and the limits to the proxy: serve_apps/runner.py). Without it, uvicorn under Serve would
hold a silent or one-byte-a-second connection forever; each attack here must end in a 4xx or a closed
connection before it gives up, and an ordinary chat still works afterwards. The stack's limits are
tests/integration/conftest.py's HTTP_LIMITS."""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx
import pytest

from tests import http_attacks as attack
from tests.integration.conftest import HTTP_LIMITS, SMOL, Stack

pytestmark = pytest.mark.integration
WITHIN_S = 3 * max(HTTP_LIMITS["header_timeout_s"], HTTP_LIMITS["body_timeout_s"]) + 15


def _address(stack: Stack) -> tuple[str, int]:
    url = urlsplit(stack.base_url)
    return url.hostname or "127.0.0.1", url.port or 80


def test_proxy_refuses_huge_header_within_bounded_time(stack: Stack) -> None:
    outcome = attack.huge_header(*_address(stack), within_s=WITHIN_S)
    assert outcome.refused and outcome.status in (None, 431), outcome


def test_proxy_refuses_twenty_thousand_headers(stack: Stack) -> None:
    outcome = attack.many_headers(*_address(stack), 20_000, within_s=WITHIN_S)
    assert outcome.refused and outcome.status in (None, 431), outcome


def test_proxy_closes_a_slow_loris_client(stack: Stack) -> None:
    outcome = attack.slow_loris(*_address(stack), every_s=1.0, within_s=WITHIN_S)
    assert outcome.refused and outcome.status in (None, 408), outcome


def test_proxy_closes_a_connection_that_sends_nothing(stack: Stack) -> None:
    outcome = attack.idle(*_address(stack), within_s=WITHIN_S)
    assert outcome.refused, outcome


def test_proxy_closes_an_idle_kept_alive_connection(stack: Stack) -> None:
    status, outcome = attack.idle_after_answer(*_address(stack), within_s=WITHIN_S)
    assert status == 200
    assert outcome.closed and not outcome.gave_up, outcome


def test_proxy_refuses_a_slow_body(stack: Stack) -> None:
    outcome = attack.slow_body(*_address(stack), "/v1/chat/completions", every_s=1.0, within_s=WITHIN_S)
    assert outcome.refused and outcome.status in (None, 408), outcome


def test_an_ordinary_chat_still_works_after_the_attacks(stack: Stack) -> None:
    chat = {"model": SMOL, "messages": [{"role": "user", "content": "What is the capital of France?"}]}
    response = httpx.post(f"{stack.openai_base}/chat/completions", json={**chat, "max_tokens": 16}, timeout=120)
    assert response.status_code == 200, response.text
    too_many = httpx.get(f"{stack.base_url}/healthz", headers={f"x-{i}": "v" for i in range(120)}, timeout=10)
    assert too_many.status_code == 431
    assert too_many.json()["error"]["code"] == "request_headers_too_large"
