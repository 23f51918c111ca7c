"""The gateway: Ray Serve ingress deployment every client calls.

It holds one DeploymentHandle per configured model and serves the ASGI app of the gateway's
composition (serve_apps/gateway_build.py), built at replica start through Serve's
`__serve_build_asgi_app__` hook, which also starts the composition's background loops.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle

from cluster.config.deployment import parse_config
from cluster.render import GATEWAY_DEPLOYMENT
from serve_apps.gateway_build import GatewayEnv, build_gateway
from serve_apps.http.direct import DirectListener
from serve_apps.telemetry.logs import configure_json_logs


@serve.deployment(name=GATEWAY_DEPLOYMENT, max_ongoing_requests=1000)
@serve.ingress()
class Gateway:
    def __init__(self, config: dict[str, Any], handles: dict[str, DeploymentHandle]) -> None:
        self._config = parse_config(config, "(deployed config)")
        self._handles = handles
        self._created = int(time.time())
        self._tasks: list[asyncio.Task[None]] = []  # held: the loop keeps only weak references to tasks
        self._on_stop: list[Callable[[], None]] = []
        self._direct: DirectListener | None = None

    async def __serve_build_asgi_app__(self) -> Any:
        configure_json_logs()
        built = build_gateway(self._config, self._handles, GatewayEnv.here(self._created))
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(loop_body) for loop_body in built.background]
        self._on_stop = built.on_stop
        gateway = self._config.gateway
        if gateway.direct_port is not None:  # serve_apps/http/direct.py
            self._direct = DirectListener(built.app, gateway.host, gateway.direct_port, gateway.http_limits)
            await self._direct.start()
        return built.app

    async def __del__(self) -> None:
        """Serve stops the replica (a scale-in, a redeploy, `serve shutdown`) after its requests finished: the
        loops end, and the spend rows and decision lines still queued for their writer threads are written
        (each bounded), so a stop loses no spend. The direct listener (gateway.direct_port) drains first: its
        socket closes, its open requests finish."""
        if self._direct is not None:
            await self._direct.stop()
        for task in self._tasks:
            task.cancel()
        for hook in self._on_stop:
            await asyncio.to_thread(hook)
