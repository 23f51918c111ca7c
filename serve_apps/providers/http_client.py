"""The providers' HTTP client: a request built once per call and handed straight to the transport.

`httpx.AsyncClient` does work per request that a provider call never needs — merging a base URL and
default headers, a cookie jar read and written on every exchange, auth and redirect loops that never
run — over a tenth of the gateway replica's CPU per request in a py-spy profile under load. A
provider's adapter needs less: its endpoint's URLs (parsed once), httpx's default headers, its timeout,
and the transport (`serve_apps/providers/aiohttp_transport.py`, or a test's `httpx.MockTransport`).

What differs from `httpx.AsyncClient`: no cookies are kept, so nothing a provider sets for one tenant's
request travels with another's. Redirects are not followed (as the adapters asked of httpx before).
Where the environment names a proxy, the adapter gets an `httpx.AsyncClient` after all (httpx mounts
the proxy's transport from the environment), with cookies off the same way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any

import httpx

from serve_apps.providers.aiohttp_transport import default_transport

# the headers httpx.AsyncClient adds to every request (gzip and deflate: what httpx always decodes)
DEFAULT_HEADERS = {
    "accept": "*/*",
    "accept-encoding": "gzip, deflate",
    "connection": "keep-alive",
    "user-agent": f"python-httpx/{httpx.__version__}",
}


def _no_cookies() -> CookieJar:
    """A jar whose policy accepts no cookie from anywhere (for the proxy case's `httpx.AsyncClient`)."""
    return CookieJar(policy=DefaultCookiePolicy(allowed_domains=[]))


class ProviderClient:
    def __init__(self, base_url: str, timeout_s: float, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._base = base_url.rstrip("/") + "/"
        self._timeout = httpx.Timeout(timeout_s).as_dict()
        self._urls: dict[str, httpx.URL] = {}
        chosen = transport or default_transport()
        self._transport = chosen
        self._proxied = (
            None
            if chosen is not None
            else httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), cookies=_no_cookies(), follow_redirects=False)
        )

    def build(self, method: str, path: str, *, headers: Mapping[str, str], json_body: Any = None) -> httpx.Request:
        """`method` on the endpoint's `path` (relative to the base URL), with httpx's default headers
        under `headers` and `json_body` encoded as httpx encodes `json=`."""
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = httpx.URL(self._base + path.lstrip("/"))
        merged = {**DEFAULT_HEADERS, **{k.lower(): v for k, v in headers.items()}}
        content = None
        if json_body is not None:
            content = json.dumps(json_body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
            merged["content-type"] = "application/json"
        return httpx.Request(method, url, headers=merged, content=content, extensions={"timeout": self._timeout})

    async def send(self, request: httpx.Request) -> httpx.Response:
        """The response once its status line arrived, its body still to be read (or closed);
        transport failures raise httpx's errors."""
        if self._proxied is not None:
            return await self._proxied.send(request, stream=True)
        assert self._transport is not None
        response = await self._transport.handle_async_request(request)
        response.request = request
        return response

    async def aclose(self) -> None:
        if self._proxied is not None:
            await self._proxied.aclose()
        elif self._transport is not None:
            await self._transport.aclose()
