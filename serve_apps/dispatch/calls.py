"""How the dispatcher reaches a target: the local models through their backend — with only the body fields
a local engine may receive (router/request/engine_fields.py), abandoned when every replica of the model goes stale
before the first byte (Serve holds a dead replica's requests until a new one starts) while another attempt could
still start — or a cloud provider through its chat API."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import Any

from router.error_codes import ErrorCode
from router.errors import TargetUnavailable
from router.request.engine_fields import engine_body
from router.request.openai_request import Kind
from router.routing.capabilities import Target
from router.routing.snapshot import ClusterSnapshot
from serve_apps.backend import BackendReply, CloudBackend, ModelBackend
from serve_apps.clocks import Clocks
from serve_apps.dispatch.admission import Admission


class Calls:
    def __init__(
        self,
        local: ModelBackend,
        providers: Mapping[str, CloudBackend],
        admission: Admission,
        snapshot: Callable[[], ClusterSnapshot],
        clocks: Clocks,
        poll_s: float,
    ) -> None:
        self._local = local
        self._providers = providers
        self._admission = admission
        self._snapshot = snapshot
        self._clock = clocks.wall  # the snapshot's stats are read at wall-clock times
        self._deadline_clock = clocks.clock  # a request's deadline is on the monotonic clock
        self._poll_s = poll_s

    async def call(
        self, target: Target, kind: Kind, body: dict[str, Any], request_id: str, *, watch_stale: float | None
    ) -> BackendReply:
        """`watch_stale`: the (monotonic) clock reading until which a local call is abandoned when its model goes stale
        (the last moment another attempt could start); None: never abandoned."""
        if target.kind == "local":
            body = engine_body(kind, body)  # only the fields a local engine may get (router/request/engine_fields.py)
            body["model"] = target.alias  # a route's name becomes its local model's
            return await self._local_unless_stale(target.alias, kind, body, request_id, watch=watch_stale)
        provider = self._providers[target.provider or ""]
        if kind == "completions":  # only to a target that serves them (the completions_api filter)
            return await provider.completions(target.alias, body, request_id)
        return await provider.chat(target.alias, body, request_id)

    async def continuation(self, target: Target, body: dict[str, Any], request_id: str) -> BackendReply:
        """A stream continuation's call (serve_apps/streams/continuation.py): chat, no stale watch."""
        return await self.call(target, "chat", body, request_id, watch_stale=None)

    async def _local_unless_stale(
        self, model: str, kind: Kind, body: dict[str, Any], request_id: str, *, watch: float | None
    ) -> BackendReply:
        """The local call; abandoned (TargetUnavailable) if every replica of the model reports a fault (an engine
        stalled) before the first byte arrives, or goes stale before it and before `watch`. Past `watch` no other
        attempt could start (the request's deadline): a call whose replicas only went stale is waited on, since
        abandoning it could only end the request in an error — a slow machine's late stats are not a hung engine's,
        which its replica reports as a fault."""
        reply = self._local.call(model, kind, body, request_id)
        call = asyncio.ensure_future(self._admission.counted(model, reply, request_id))
        if watch is None:
            return await call
        try:
            while True:
                done, _ = await asyncio.wait({call}, timeout=self._poll_s)
                if done:
                    return call.result()
                snapshot, now = self._snapshot(), self._clock()
                replicas = snapshot.for_model(model)
                if replicas and all(snapshot.unusable(r, now) for r in replicas):
                    faults = {r.fault for r in replicas if r.fault and not snapshot.is_stale(r, now)}
                    if faults:  # the replicas say so themselves (an engine stalled): never worth waiting on
                        message = (
                            f"every replica of {model} left routing while waiting for the first byte: {min(faults)}"
                        )
                        raise TargetUnavailable(message, code=ErrorCode.REPLICA_FAULT)
                    if self._deadline_clock() < watch:
                        message = f"every replica of {model} went stale while waiting for the first byte"
                        raise TargetUnavailable(message, code=ErrorCode.REPLICAS_STALE)
        finally:
            if not call.done():
                call.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await call  # let the local call unwind (in-flight count, Serve cancel)
