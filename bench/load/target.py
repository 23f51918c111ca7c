"""What every bench command checks about its target before loading it: the API key from the
environment, and that the URL answers and serves the model. Errors carry the CLI exit code
(1: unreachable, 2: bad input) in the command's own error class."""

from __future__ import annotations

import os

import httpx

from bench.load.loadgen import AuthRequired, served_models


class BenchError(Exception):
    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


def api_key_from_env(env_name: str | None, error: type[BenchError] = BenchError) -> str | None:
    if env_name is None:
        return None
    if not os.environ.get(env_name):
        raise error(f"--api-key-env: environment variable {env_name} is not set", 2)
    return os.environ[env_name]


async def preflight(client: httpx.AsyncClient, url: str, model: str, error: type[BenchError] = BenchError) -> None:
    try:
        models = await served_models(client)
    except httpx.HTTPError as exc:
        reason = str(exc) or type(exc).__name__
        raise error(f"cannot reach {url}: {reason} (is the server running?)", 1) from None
    except AuthRequired as exc:
        raise error(f"{url} refused the request ({exc}): pass the API key with --api-key-env NAME", 2) from None
    if models is not None and model not in models:
        raise error(f"{url} does not serve model {model!r}; it serves: {', '.join(models) or '(none)'}", 2)
