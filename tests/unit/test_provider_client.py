"""The providers' HTTP client: requests as httpx.AsyncClient would build them, no cookies carried between calls.

The transport is httpx's `MockTransport`, which sees exactly the `httpx.Request` a real transport would send.
"""

from __future__ import annotations

import httpx
import pytest

from serve_apps.providers.http_client import DEFAULT_HEADERS, ProviderClient

SEEN: list[httpx.Request] = []


def answer(request: httpx.Request) -> httpx.Response:
    SEEN.append(request)
    return httpx.Response(200, json={"ok": True}, headers={"set-cookie": "session=tenant-a; Path=/"})


@pytest.fixture(autouse=True)
def _clear() -> None:
    SEEN.clear()


@pytest.mark.parametrize("base", ["https://api.example/v1", "https://api.example/v1/"])
@pytest.mark.parametrize("path", ["chat/completions", "/chat/completions"])
async def test_paths_join_the_base_url_as_httpx_base_url_does(base: str, path: str) -> None:
    client = ProviderClient(base, 30, httpx.MockTransport(answer))
    request = client.build("POST", path, headers={}, json_body={"a": 1})
    assert str(request.url) == "https://api.example/v1/chat/completions"
    expected = httpx.AsyncClient(base_url=base).build_request("POST", "chat/completions", json={"a": 1})
    assert request.url == expected.url


async def test_body_and_headers_are_those_httpx_would_send() -> None:
    client = ProviderClient("https://api.example/v1", 30, httpx.MockTransport(answer))
    body = {"model": "m", "messages": [{"role": "user", "content": "héllo"}]}
    request = client.build("POST", "chat/completions", headers={"Authorization": "Bearer k"}, json_body=body)
    reference = httpx.Request("POST", "https://api.example/v1/chat/completions", json=body)
    assert request.content == reference.content  # compact, UTF-8, as httpx encodes json=
    assert request.headers["content-type"] == "application/json"
    assert request.headers["content-length"] == str(len(reference.content))
    assert request.headers["authorization"] == "Bearer k"
    for name, value in DEFAULT_HEADERS.items():
        assert request.headers[name] == value
    assert request.extensions["timeout"] == httpx.Timeout(30).as_dict()


async def test_a_cookie_one_call_got_never_goes_out_with_the_next() -> None:
    # httpx.AsyncClient would keep `session=tenant-a` and send it on every later call, whoever's it is
    client = ProviderClient("https://api.example/v1", 30, httpx.MockTransport(answer))
    for _ in range(2):
        response = await client.send(client.build("GET", "models", headers={}))
        assert response.status_code == 200 and response.request.url.path == "/v1/models"
        await response.aread()
    assert "cookie" not in SEEN[-1].headers
    await client.aclose()


async def test_with_an_environment_proxy_the_client_is_httpx_own_without_cookies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    client = ProviderClient("https://api.example/v1", 30)
    assert client._proxied is not None and client._transport is None
    jar = client._proxied.cookies
    request = httpx.Request("GET", "https://api.example/v1/models")
    response = answer(request)
    response.request = request
    jar.extract_cookies(response)
    assert not list(jar.jar)
    await client.aclose()
