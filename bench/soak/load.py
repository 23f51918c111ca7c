"""The traffic of `bench soak`: the mixed requests, the probe, and the fault episodes of the cloud simulator.

mixed request   a chat of the seeded workload (bench/load/workload.py: prompt and output lengths, a share
                with one of a few shared system prompts), streamed with probability `stream_share`
                (measured by `LoadGenerator.send`: TTFT, e2e, usage, route) or not (`send_json`);
                with probability `cloud_share` it carries `x-spillover-residency: <cloud_region>`,
                which only the cloud simulator's region satisfies: those burst to the cloud whatever
                the local load; the others are plain and the gateway chooses (local, or the cloud
                when local is saturated). No temperature is sent: random-word prompts at temperature
                0 would loop, and the gateway counts greedy loops against the replica's health.
probe           a fixed prompt at temperature 0, `x-spillover-residency: local_only` (the local
                model answers it), non-streamed: its first answer is the reference, every later
                one is wrong when its text differs
fault episode   every `fault_every_s`, one fault of `faults` (in turn) is switched on in the cloud
                simulator (`POST /control/faults`, `<fault>_rate: fault_rate`) for `fault_s`, then
                back to what the simulator had before; at most `max_episodes` episodes
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from bench.load.loadgen import LoadGenerator, error_code
from bench.load.request_result import RequestResult
from bench.load.workload import RequestFactory, WorkItem
from bench.soak.metrics import SoakRequest
from router import headers as hdr

Clock = Callable[[], float]
FAULT_NAMES = ("error_5xx", "rate_limit", "timeout", "reset", "midstream_cut", "malformed")
DEFAULT_FAULTS = ("error_5xx", "rate_limit", "reset", "midstream_cut", "timeout")


@dataclass(frozen=True)
class TrafficMix:
    stream_share: float = 0.5
    cloud_share: float = 0.1
    cloud_region: str = "local-sim"
    probe_prompt: str = "What is the capital of France?"
    probe_max_tokens: int = 16
    request_timeout_s: float = 360.0  # beyond the gateway's request_timeout_s (300 by default)


class SoakTraffic:
    """Sends the soak's requests through one client bound to the gateway's base URL."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        model: str,
        mix: TrafficMix,
        factory: RequestFactory,
        *,
        rng: random.Random,
        clock: Clock,
    ) -> None:
        self._client = client
        self._model = model
        self._mix = mix
        self._factory = factory
        self._rng = rng
        self._clock = clock
        self._loadgen = LoadGenerator(client, model, clock=clock, request_timeout_s=mix.request_timeout_s)
        self._origin = clock()  # the same origin as the load generator's: one time line
        self.first_probe: str | None = None

    def elapsed(self) -> float:
        return self._clock() - self._origin

    def draw(self) -> tuple[WorkItem, str, str]:
        """The next request: its work item, kind (stream | json) and share (mixed | cloud)."""
        item = self._factory.take(1)[0]
        share = "cloud" if self._rng.random() < self._mix.cloud_share else "mixed"
        kind = "stream" if self._rng.random() < self._mix.stream_share else "json"
        return item, kind, share

    async def send(self, item: WorkItem, kind: str, share: str) -> SoakRequest:
        headers = {hdr.RESIDENCY: self._mix.cloud_region} if share == "cloud" else {}
        start = self.elapsed()
        try:
            if kind == "stream":
                call = self._loadgen.send(item, headers=headers)
            else:
                call = self.send_json(item.index, self._body(item), headers)
            result = await asyncio.wait_for(call, self._mix.request_timeout_s)
        except TimeoutError:
            result = RequestResult(item.index, start, self.elapsed() - start, error="timeout")
        return SoakRequest(kind, share, result)

    def _body(self, item: WorkItem) -> dict[str, Any]:
        return {"model": self._model, "messages": [dict(m) for m in item.messages], "max_tokens": item.max_tokens}

    async def probe(self, index: int) -> SoakRequest:
        body = {
            "model": self._model,
            "messages": [{"role": "user", "content": self._mix.probe_prompt}],
            "max_tokens": self._mix.probe_max_tokens,
            "temperature": 0,
        }
        start = self.elapsed()
        texts: list[str] = []
        try:
            call = self.send_json(index, body, {hdr.RESIDENCY: "local_only"}, texts)
            result = await asyncio.wait_for(call, self._mix.request_timeout_s)
        except TimeoutError:
            result = RequestResult(index, start, self.elapsed() - start, error="timeout")
        text = texts[0] if texts and result.ok else None
        wrong = False
        if text is not None:
            if self.first_probe is None:
                self.first_probe = text
            wrong = text != self.first_probe
        return SoakRequest("probe", "probe", result, answer=text, wrong=wrong)

    async def send_json(
        self, index: int, body: dict[str, Any], headers: Mapping[str, str], texts: list[str] | None = None
    ) -> RequestResult:
        """One non-streamed chat completion, measured like `LoadGenerator.send` measures a stream."""
        start = self.elapsed()
        status: int | None = None
        response_headers: Mapping[str, str] = {}
        usage: dict[str, Any] = {}
        error: str | None = None
        try:
            response = await self._client.post("chat/completions", json=body, headers=dict(headers))
            status, response_headers = response.status_code, response.headers
            if status != 200:
                error = error_code(response.content, status)
            else:
                error, usage = _answer(response, texts)
        except httpx.TimeoutException:
            error = "timeout"
        except httpx.ConnectError:
            error = "connect_error"
        except (httpx.RemoteProtocolError, httpx.ReadError):
            error = "stream_cut"
        except httpx.HTTPError:
            error = "http_error"
        completion = usage.get("completion_tokens")
        return RequestResult(
            index=index,
            start_s=start,
            e2e_s=self.elapsed() - start,
            output_tokens=completion if isinstance(completion, int) else 0,
            prompt_tokens=usage.get("prompt_tokens") if isinstance(usage.get("prompt_tokens"), int) else None,
            status=status,
            error=error,
            route=response_headers.get(hdr.ROUTE),
            target=response_headers.get(hdr.TARGET),
        )


def _answer(response: httpx.Response, texts: list[str] | None) -> tuple[str | None, dict[str, Any]]:
    """(error code or None, usage) of a 200 body: a complete answer has a choice with a message."""
    try:
        data = response.json()
    except ValueError:
        return "malformed", {}
    if not isinstance(data, dict):
        return "malformed", {}
    choices = data.get("choices")
    message = (
        choices[0].get("message") if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
    )
    if not isinstance(message, dict) or (message.get("content") is None and not message.get("tool_calls")):
        return "no_answer", {}
    if texts is not None and isinstance(message.get("content"), str):
        texts.append(message["content"])
    usage = data.get("usage")
    return None, usage if isinstance(usage, dict) else {}


@dataclass(frozen=True)
class FaultPlan:
    faults: tuple[str, ...] = DEFAULT_FAULTS
    rate: float = 0.25
    every_s: float = 150.0
    duration_s: float = 30.0
    max_episodes: int = 20
    hang_s: float = 5.0
    retry_after_s: float = 1.0


@dataclass(frozen=True)
class FaultEpisode:
    index: int
    fault: str
    start_s: float
    end_s: float
    error: str | None = None  # the control API refused or failed

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


async def fault_episodes(
    control: httpx.AsyncClient,
    sim_base: str,
    plan: FaultPlan,
    original: Mapping[str, Any],
    stop: asyncio.Event,
    elapsed: Clock,
    episodes: list[FaultEpisode],
) -> None:
    """Run the plan's episodes until `stop` (module docstring); each ends by restoring `original`."""
    for index in range(plan.max_episodes):
        if await _stopped(stop, plan.every_s):
            return
        fault = plan.faults[index % len(plan.faults)]
        field = f"{fault}_rate"
        start = elapsed()
        error = await _post(
            control,
            f"{sim_base}/control/faults",
            {field: plan.rate, "hang_s": plan.hang_s, "retry_after_s": plan.retry_after_s},
        )
        try:
            if error is None:
                await _stopped(stop, plan.duration_s)
        finally:
            keys = (field, "hang_s", "retry_after_s")
            restored = await _post(
                control, f"{sim_base}/control/faults", {k: original[k] for k in keys if k in original}
            )
            episodes.append(FaultEpisode(index, fault, start, elapsed(), error or restored))


async def _stopped(stop: asyncio.Event, wait_s: float) -> bool:
    """Wait `wait_s` seconds or until `stop`; whether it was stopped."""
    try:
        await asyncio.wait_for(stop.wait(), timeout=wait_s)
    except TimeoutError:
        return False
    return True


async def _post(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> str | None:
    try:
        response = await client.post(url, json=body)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}"
    return None if response.status_code == 200 else f"HTTP {response.status_code}"
