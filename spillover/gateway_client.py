"""How the operator commands (`spillover status`, `spillover explain`) call a gateway.

With `gateway.auth` on, the operator endpoints need an admin tenant's key: the commands read it
from the environment variable `--api-key-env` names (SPILLOVER_API_KEY by default), never from
the command line, where it would land in shell history and process listings.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

import httpx

from cluster.config.deployment import SpilloverConfig
from router.errors import ClusterError

DEFAULT_KEY_ENV = "SPILLOVER_API_KEY"


def add_key_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--api-key-env",
        default=DEFAULT_KEY_ENV,
        metavar="NAME",
        help=f"environment variable holding an admin tenant's key when the gateway has auth on ({DEFAULT_KEY_ENV})",
    )


def get_json(
    url: str,
    path: str,
    key_env: str,
    environ: Mapping[str, str] = os.environ,
    transport: httpx.BaseTransport | None = None,
    *,
    body: Any = None,
) -> dict[str, Any]:
    """GET `url + path` as JSON (POST `body` when given); a clear ClusterError for no gateway, a refused
    key or another status (quoting the gateway's error message)."""
    key = environ.get(key_env)
    headers = {"authorization": f"Bearer {key}"} if key else {}
    try:
        with httpx.Client(transport=transport, timeout=5 if body is None else 60) as client:
            if body is None:
                response = client.get(f"{url}{path}", headers=headers)
            else:
                response = client.post(f"{url}{path}", headers=headers, json=body)
    except httpx.HTTPError as exc:
        raise ClusterError(
            f"no gateway answering at {url} ({type(exc).__name__}); start one with `spillover serve`"
        ) from None
    if response.status_code in (401, 403):
        need = "an admin tenant's key" if response.status_code == 403 or key else "a key"
        raise ClusterError(f"{url}{path} answered {response.status_code}: set {key_env} to {need} (gateway.auth is on)")
    if response.status_code == 404:
        try:
            message = str(response.json()["error"]["message"])
        except (ValueError, KeyError, TypeError):
            message = response.text[:200]
        raise ClusterError(message)
    if response.status_code != 200:
        try:
            error = response.json()["error"]
            text = f"{error['code']}: {error['message']}"
        except (ValueError, KeyError, TypeError):
            text = response.text
        raise ClusterError(f"{url}{path} answered {response.status_code}: {text[:400]}")
    return dict(response.json())


def gateway_url(config: SpilloverConfig, override: str | None) -> str:
    """`--url`, else the config's gateway (a wildcard listener is reached on loopback)."""
    host = "127.0.0.1" if config.gateway.host in ("0.0.0.0", "::") else config.gateway.host
    return (override or f"http://{host}:{config.gateway.port}").rstrip("/")
