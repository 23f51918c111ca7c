"""Health probes (router/resilience/health.py): the evidence that moves a target's health when traffic is thin.

Three levels, each on its own period (`resilience.health`):

    liveness     ~10 s   local: a replica of the model pushed fresh stats (no request sent; no
                         replica reported yet = no evidence, so start-up is not a failure);
                         cloud: `GET /models` with our key (a 401 is found without traffic)
    latency      ~30 s   a one-message chat through the same path as traffic, within latency_slo_s
                         (local: only while a replica is alive); a cloud provider's prompt and
                         parameters are its `probe:` (cluster/config/resilience.py)
    correctness  ~5 min  local models with `golden:` only: the answer must match `expect`

Fair judging:
* a probe error whose rule marks credentials bad (401/403, key variable unset) makes the target
  black; a client-side rejection of the probe's request (`router.resilience.failure` class CLIENT: a 4xx other
  than 401/403/408/429, e.g. a content filter) is no evidence of ill health: it is logged, counted
  on the machine and the state is kept; any other failure is a failed probe;
* while live traffic is recent, the machine records probes without acting on them
  (router/resilience/health_evidence.py);
* the schedule follows the target, not the gateway's start: liveness and latency probes of a red
  target run every `recovery_probe_s` (when that is shorter), and after each health transition the
  target's next probes are due one period after it. The same fault sequence then meets the same
  probes whether it starts 10 s or an hour after start-up.

Probes never go through the dispatcher: they are not traffic, they cost no retry budget and appear
in no decision record.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from cluster.config.deployment import SpilloverConfig
from cluster.config.model_spec import ModelSpec
from cluster.config.resilience import ProviderProbe
from router.errors import RequestError
from router.resilience.failure import FailureClass, classify, rule_for
from router.resilience.health import Health, HealthBoard
from router.routing.capabilities import local_id, provider_key
from router.routing.snapshot import ClusterSnapshot
from serve_apps.backend import CloudBackend, ModelBackend

log = logging.getLogger("spillover.prober")

Level = Literal["liveness", "latency", "correctness"]
TINY_PROMPT = "Say OK."


class ProbedProvider(CloudBackend, Protocol):
    async def probe(self) -> None: ...


@dataclass(frozen=True)
class ProbeCheck:
    target: str  # health key: local:<alias> | cloud:<provider>
    level: Level
    every_s: float
    run: Callable[[], Awaitable[bool | None]]  # True passed, False failed (or raises), None: no evidence


def _tiny_chat(model: str, prompt: str, max_tokens: int | None, temperature: float | None = 0) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": prompt}]}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if temperature is not None:
        body["temperature"] = temperature
    return body


def _answer_text(body: Mapping[str, Any] | None) -> str:
    choices = (body or {}).get("choices") or [{}]
    message = choices[0].get("message") or {}
    return str(message.get("content") or "")


def local_checks(
    spec: ModelSpec,
    config: SpilloverConfig,
    backend: ModelBackend,
    snapshot: Callable[[], ClusterSnapshot],
    clock: Callable[[], float],
) -> list[ProbeCheck]:
    health, alias, key = config.resilience.health, spec.alias, local_id(spec.alias)

    async def alive() -> bool | None:
        snap, now = snapshot(), clock()
        replicas = snap.for_model(alias)
        if not replicas:
            return None  # not started yet (or every replica forgotten): readiness, not health
        return any(snap.unusable(r, now) is None for r in replicas)

    async def answers(prompt: str, max_tokens: int, expect: str | None) -> bool | None:
        if not await alive():
            return None  # the liveness probe speaks for a model that is down or not up yet
        body = _tiny_chat(alias, prompt, max_tokens)
        reply = await backend.call(alias, "chat", body, f"probe-{key}-{int(clock() * 1000)}")
        if reply.chunks is not None:  # never asked for; drain to be safe
            async for _ in reply.chunks:
                pass
            return expect is None
        return expect is None or re.search(expect, _answer_text(reply.body), re.IGNORECASE) is not None

    checks = [
        ProbeCheck(key, "liveness", health.liveness_probe_s, alive),
        ProbeCheck(key, "latency", health.latency_probe_s, lambda: answers(TINY_PROMPT, 1, None)),
    ]
    if spec.golden is not None:
        golden = spec.golden
        checks.append(
            ProbeCheck(
                key,
                "correctness",
                health.correctness_probe_s,
                lambda: answers(golden.prompt, golden.max_tokens, golden.expect),
            )
        )
    return checks


def cloud_checks(provider: ProbedProvider, alias: str, config: SpilloverConfig) -> list[ProbeCheck]:
    health, key = config.resilience.health, provider_key(provider.name)
    spec = next((p.probe for p in config.cloud.providers if p.name == provider.name), ProviderProbe())

    async def alive() -> bool:
        await provider.probe()
        return True

    async def answers() -> bool:
        body = _tiny_chat(alias, spec.prompt, spec.max_tokens, spec.temperature)
        reply = await provider.chat(alias, body, f"probe-{key}")
        if reply.chunks is not None:
            async for _ in reply.chunks:
                pass
        return True

    return [
        ProbeCheck(key, "liveness", health.liveness_probe_s, alive),
        ProbeCheck(key, "latency", health.latency_probe_s, answers),
    ]


class Prober:
    """Runs each check on its period and feeds the health board. `run_due(now)` is one pass
    (tests call it with a fake clock); `run()` loops until cancelled."""

    def __init__(
        self,
        checks: Sequence[ProbeCheck],
        health: HealthBoard,
        *,
        latency_slo_s: float,
        timeout_s: float,
        recovery_probe_s: float | None = None,  # liveness / latency period of a red target; None: their own
        clock: Callable[[], float] = time.monotonic,  # schedules probes: a wall-clock step must not skip or bunch them
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        tick_s: float = 0.25,
    ) -> None:
        self._checks = list(checks)
        self._health = health
        self._slo_s = latency_slo_s
        self._timeout_s = timeout_s
        self._recovery_s = recovery_probe_s
        self._clock = clock
        self._sleep = sleep
        self._tick_s = tick_s
        self._due: dict[int, float] = {}
        self._seen: dict[str, int] = {}  # target -> transitions_total when its schedule was last set
        self.results: dict[tuple[str, str], bool | None] = {}  # (target, level) -> last outcome (None: no evidence)

    async def run(self) -> None:
        while True:
            await self.run_due(self._clock())
            await self._sleep(self._tick_s)

    async def run_due(self, now: float) -> None:
        self._follow_transitions(now)
        due = [i for i, c in enumerate(self._checks) if self._due.get(i, now) <= now]
        for i in due:
            self._due[i] = now + self._period(self._checks[i])
        await asyncio.gather(*(self._probe(self._checks[i]) for i in due))
        self._follow_transitions(now)

    def _period(self, check: ProbeCheck) -> float:
        if self._recovery_s is None or check.level == "correctness":
            return check.every_s
        if self._health.get(check.target).state is Health.RED:
            return min(check.every_s, self._recovery_s)
        return check.every_s

    def _follow_transitions(self, now: float) -> None:
        """After a target's health changed, its next liveness / latency probes are due one period
        after the change (not on a phase set by the gateway's start)."""
        for i, check in enumerate(self._checks):
            if check.level == "correctness":
                continue
            machine = self._health.get(check.target)
            total = machine.transitions_total
            if self._seen.get(f"{check.target}/{check.level}") == total:
                continue
            self._seen[f"{check.target}/{check.level}"] = total
            transitions = machine.transitions
            if total and transitions and i in self._due:
                self._due[i] = max(transitions[-1].at + self._period(check), now)

    async def _probe(self, check: ProbeCheck) -> None:
        machine = self._health.get(check.target)
        limit = self._slo_s if check.level == "latency" else self._timeout_s
        began = time.perf_counter()
        try:
            ok = await asyncio.wait_for(check.run(), timeout=limit)
        except RequestError as exc:
            if rule_for(exc).marks_black:
                machine.credential_failed(exc.code or "")
                self.results[(check.target, check.level)] = False
                log.warning("probe %s %s: credentials refused (%s)", check.level, check.target, exc.code)
                return
            if classify(exc) is FailureClass.CLIENT:
                # the target refused the probe's request itself (a content filter, a parameter it does
                # not take): a fact about the probe, not about the target's health
                machine.probe_rejected(check.level, exc.message)
                self.results[(check.target, check.level)] = None
                log.warning(
                    "probe %s %s rejected as a client error (health unchanged; see its `probe:` config): %s",
                    check.level,
                    check.target,
                    exc.message[:300],
                )
                return
            ok = False
            log.info("probe %s %s failed: %s", check.level, check.target, exc.code)
        except TimeoutError:
            ok = False
            log.info("probe %s %s took longer than %.1fs", check.level, check.target, limit)
        except Exception as exc:  # noqa: BLE001 -- a probe must never kill the loop
            ok = False
            log.info("probe %s %s failed: %s", check.level, check.target, type(exc).__name__)
        self.results[(check.target, check.level)] = ok
        if ok is not None:
            machine.probe(check.level, ok)
        log.debug("probe %s %s ok=%s in %.3fs", check.level, check.target, ok, time.perf_counter() - began)
