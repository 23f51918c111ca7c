"""The operator commands' gateway calls (spillover/gateway_client.py) over httpx.MockTransport."""

from __future__ import annotations

import httpx
import pytest

from router.errors import ClusterError
from spillover.gateway_client import get_json

URL = "http://127.0.0.1:8000"


def answering(status: int, body: object, seen: list[httpx.Request] | None = None) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        return httpx.Response(status, json=body)

    return httpx.MockTransport(handle)


def test_the_key_comes_from_the_named_environment_variable() -> None:
    seen: list[httpx.Request] = []
    data = get_json(URL, "/v1/spillover/cluster", "OPS_KEY", {"OPS_KEY": "sk-admin"}, answering(200, {"ok": 1}, seen))
    assert data == {"ok": 1}
    assert seen[0].headers["authorization"] == "Bearer sk-admin"


def test_no_key_sends_no_header_and_a_401_says_which_variable_to_set() -> None:
    seen: list[httpx.Request] = []
    with pytest.raises(ClusterError, match="set SPILLOVER_API_KEY to a key"):
        get_json(URL, "/v1/spillover/cluster", "SPILLOVER_API_KEY", {}, answering(401, {}, seen))
    assert "authorization" not in seen[0].headers


def test_a_non_admin_key_is_told_it_needs_an_admin() -> None:
    with pytest.raises(ClusterError, match="an admin tenant's key"):
        get_json(URL, "/v1/spillover/cluster", "K", {"K": "sk-user"}, answering(403, {}))


def test_not_found_quotes_the_gateways_message() -> None:
    with pytest.raises(ClusterError, match="no decision record abc"):
        get_json(
            URL,
            "/v1/spillover/decisions/abc",
            "K",
            {},
            answering(404, {"error": {"message": "no decision record abc"}}),
        )


def test_no_gateway_is_a_clear_error() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(ClusterError, match="no gateway answering"):
        get_json(URL, "/v1/spillover/cluster", "K", {}, httpx.MockTransport(refuse))
