"""Command line of the cloud simulator: `spillover cloud-sim ...` or `python -m bench.cloud_sim ...`.

`add_cloud_sim_parser(subparsers)` registers the `cloud-sim` subcommand (its `func` default
is `run_cloud_sim`); `add_cloud_sim_arguments(parser)` adds the same flags to any parser.
Flags left out keep `SimSettings`' defaults. `run_cloud_sim(args)` serves with uvicorn
(`server_config`: header size and count, slow and idle clients bounded by `gateway.http_limits`'
defaults) until SIGINT/SIGTERM, after printing `cloud-sim listening on http://HOST:PORT/v1`
(`--port 0` picks a free port and prints it). Exit codes: 0 stopped, 2 bad flags.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import sys
from typing import Any

import uvicorn

from bench.cloud_sim.faults import SimulatedCut
from bench.cloud_sim.server import build_app
from bench.cloud_sim.settings import InvalidSettings, SimSettings
from cluster.config.gateway import HttpLimits
from serve_apps.http.limits import uvicorn_options

DEFAULT_PORT = 9100

# flag -> SimSettings field, for the flags that map one to one
_FLOAT_FLAGS: tuple[tuple[str, str], ...] = (
    ("--ttft-s", "ttft_s"),
    ("--tokens-per-s", "tokens_per_s"),
    ("--error-5xx-rate", "error_5xx_rate"),
    ("--rate-limit-rate", "rate_limit_rate"),
    ("--retry-after-s", "retry_after_s"),
    ("--timeout-rate", "timeout_rate"),
    ("--hang-s", "hang_s"),
    ("--reset-rate", "reset_rate"),
    ("--midstream-cut-rate", "midstream_cut_rate"),
    ("--malformed-rate", "malformed_rate"),
    ("--schema-invalid-rate", "schema_invalid_rate"),
    ("--tool-args-invalid-rate", "tool_args_invalid_rate"),
    ("--malformed-event-rate", "malformed_event_rate"),
    ("--no-done-rate", "no_done_rate"),
)


def add_cloud_sim_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `cloud-sim` on an `argparse` subparsers object; returns the new parser."""
    parser = subparsers.add_parser(
        "cloud-sim",
        help="run a fake OpenAI-compatible (or Anthropic Messages) cloud API with injectable faults",
        description="An OpenAI-compatible (--api anthropic: Anthropic Messages API) chat server with configurable "
        "latency, capacity and faults.",
    )
    add_cloud_sim_arguments(parser)
    parser.set_defaults(func=run_cloud_sim)
    return parser


def add_cloud_sim_arguments(parser: argparse.ArgumentParser) -> None:
    fields = SimSettings.model_fields
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any)")
    parser.add_argument(
        "--api",
        choices=("openai", "anthropic"),
        default="openai",
        help="wire protocol: openai (POST /v1/chat/completions) or anthropic (the Messages API, POST /v1/messages; "
        "the key in x-api-key) (default openai)",
    )
    parser.add_argument(
        "--models", default=None, help=f"comma-separated model names (default {','.join(fields['models'].default)})"
    )
    parser.add_argument(
        "--max-concurrency",
        type=int,
        default=None,
        help=f"in-flight requests before 429 (default {fields['max_concurrency'].default}; 0: unlimited)",
    )
    for flag, name in _FLOAT_FLAGS:
        field = fields[name]
        parser.add_argument(
            flag, type=float, default=None, help=f"{field.description or name} (default {field.default:g})"
        )
    key = parser.add_mutually_exclusive_group()
    key.add_argument("--api-key", default=None, help="require `Authorization: Bearer <key>` (visible in ps)")
    key.add_argument("--api-key-env", default=None, metavar="NAME", help="require the key held in env var NAME")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault draws (default 0)")
    parser.add_argument("--log", default=None, metavar="FILE", help="append one JSON line per /v1 request to FILE")
    parser.add_argument(
        "--log-bodies",
        action="store_true",
        help="also write each request's body, as it arrived (its first MiB), into the --log FILE lines",
    )


def settings_from_args(args: argparse.Namespace, env: dict[str, str] | None = None) -> SimSettings:
    """The `SimSettings` the flags ask for; raises `InvalidSettings`."""
    env = dict(os.environ) if env is None else env
    values: dict[str, Any] = {name: getattr(args, _dest(flag)) for flag, name in _FLOAT_FLAGS}
    values["max_concurrency"] = args.max_concurrency
    values["api"] = getattr(args, "api", None)
    if args.models is not None:
        values["models"] = tuple(m.strip() for m in args.models.split(",") if m.strip())
    if args.api_key_env is not None:
        if not env.get(args.api_key_env):
            raise InvalidSettings(f"--api-key-env: environment variable {args.api_key_env} is not set")
        values["api_key"] = env[args.api_key_env]
    elif args.api_key is not None:
        values["api_key"] = args.api_key
    return SimSettings().merged({k: v for k, v in values.items() if v is not None})


def run_cloud_sim(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_args(args)
    except InvalidSettings as exc:
        print(f"error: cloud-sim: {exc}", file=sys.stderr, flush=True)
        return 2
    app = build_app(settings, rng=random.Random(args.seed), log_path=args.log, log_bodies=args.log_bodies)
    logging.getLogger("uvicorn.error").addFilter(_DropSimulatedCuts())
    asyncio.run(_serve(uvicorn.Server(server_config(app, args.host, args.port)), args.host))
    return 0


def server_config(app: Any, host: str, port: int, limits: HttpLimits | None = None) -> uvicorn.Config:
    """The simulator's uvicorn server, its headers and slow or idle clients bounded like the gateway's
    (`gateway.http_limits`' defaults unless `limits`: serve_apps/http/limits.py)."""
    return uvicorn.Config(
        app, host=host, port=port, log_level="warning", access_log=False, lifespan="off",
        timeout_graceful_shutdown=2, **uvicorn_options(limits or HttpLimits()),
    )  # fmt: skip


async def _serve(server: uvicorn.Server, host: str) -> None:
    task = asyncio.create_task(server.serve())
    while not server.started and not task.done():
        await asyncio.sleep(0.02)
    if server.started:
        port = server.servers[0].sockets[0].getsockname()[1]
        print(f"cloud-sim listening on http://{host}:{port}/v1", flush=True)
    await task


class _DropSimulatedCuts(logging.Filter):
    """A simulated mid-stream cut is meant to drop the connection: no traceback for it."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, BaseExceptionGroup):
            return not any(isinstance(e, SimulatedCut) for e in exc.exceptions)
        return not isinstance(exc, SimulatedCut)


def _dest(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")
