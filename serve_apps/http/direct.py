"""The gateway replica's own HTTP listener (`gateway.direct_port`): the gateway served without Serve's proxy.

Every request through Serve's HTTP proxy crosses a Python process before it reaches the gateway replica
(bench/reports/cpu-smollm2-overhead: +22 ms at p50 on a 1-token chat, and a third of the throughput, on a 2-core
box). With `gateway.direct_port`
each gateway replica also serves the same ASGI app from a uvicorn of its own, on `gateway.host:direct_port`:

* one stable address per node: the socket is bound with SO_REUSEPORT, so every gateway replica on a node binds
  the same port and the kernel spreads new connections over them (Linux lets only processes of the same user
  share it); a node without a gateway replica has nothing on that port;
* the same promises as the proxy's port: the same app (auth, routes, body bound), the same host (so the same
  loopback-or-auth rule, cluster/config/gateway.py) and the same `gateway.http_limits`
  (`LimitedHttpProtocol`, serve_apps/http/limits.py);
* draining: `stop()` closes the listening socket first (new connections go to the node's other gateway replicas),
  waits `ACCEPTED_GRACE_S` for the connections it accepted just before to show their request (uvicorn's shutdown
  closes at once every connection with no request under way, so a request already on its way would see the
  connection drop unanswered), lets open requests finish for up to `grace_s`, then closes what is left.
  Connections the kernel had queued for this socket but the replica had not accepted yet are reset when it closes
  (SO_REUSEPORT keeps one queue per socket) unless the node sets `net.ipv4.tcp_migrate_req=1`, which hands them to
  another replica's socket (docs/architecture.md).

`x-request-id` as through Serve's proxy (`ProxyRequestId`): the proxy hands the app the client's `x-request-id`
(a new one when there is none) and puts that id on the response, and the app, built to run behind it, leaves
the header to it (serve_apps/http/surface.py).

Serve does not see these requests: its `max_ongoing_requests` and request metrics count only the proxy's; the
gateway's own admission, limits and metrics count both.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import uuid
from typing import Any

import uvicorn

from cluster.config.gateway import HttpLimits
from serve_apps.http.limits import uvicorn_options

log = logging.getLogger("spillover.direct")
BACKLOG = 2048
ACCEPTED_GRACE_S = 0.5  # for a connection accepted just before the listener closed to show its request


def shared_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on `host:port` that every process of this user on the node may bind too."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class ProxyRequestId:
    """ASGI middleware: what Serve's proxy does with `x-request-id`: the client's (else a new one) in the
    request's headers, and on the response's."""

    def __init__(self, app: Any) -> None:
        self._app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        headers = list(scope.get("headers", []))
        given = next((value for name, value in headers if name == b"x-request-id"), None)
        request_id = given if given is not None else uuid.uuid4().hex.encode()
        if given is None:
            headers.append((b"x-request-id", request_id))

        async def send_with_id(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                sent = list(message.get("headers", []))
                if not any(name.lower() == b"x-request-id" for name, _ in sent):
                    message = {**message, "headers": [*sent, (b"x-request-id", request_id)]}
            await send(message)

        await self._app({**scope, "headers": headers}, receive, send_with_id)


class DirectListener:
    """`app` on `host:port` from this process's running loop, until `stop()`."""

    def __init__(self, app: Any, host: str, port: int, limits: HttpLimits, *, grace_s: int = 15) -> None:
        self._config = uvicorn.Config(
            ProxyRequestId(app),
            lifespan="off",
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=grace_s,
            **uvicorn_options(limits),
        )
        self._host, self._port = host, port
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def address(self) -> str:
        return f"{self._host}:{self._port}"

    async def start(self) -> None:
        """Bind and serve; returns once the listener accepts connections (OSError: the port is taken by another
        user's process, or the address is not this node's)."""
        sock = shared_socket(self._host, self._port)
        server = uvicorn.Server(self._config)
        self._server = server
        self._task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
        while not server.started:
            if self._task.done():  # it failed before it listened
                self._task.result()
                raise OSError(f"the gateway's direct listener on {self.address} stopped before it started")
            await asyncio.sleep(0.01)
        log.info("the gateway also listens on %s (gateway.direct_port)", self.address)

    async def stop(self) -> None:
        """Close the listening socket, let open requests finish (up to `grace_s`), then close the rest."""
        if self._server is None or self._task is None:
            return
        for listening in self._server.servers:  # uvicorn's shutdown closes them too: closing twice is a no-op
            listening.close()
        await asyncio.sleep(ACCEPTED_GRACE_S)
        self._server.should_exit = True
        try:
            await self._task
        except Exception:  # a replica going away: said, not raised
            log.exception("the gateway's direct listener on %s did not stop cleanly", self.address)
