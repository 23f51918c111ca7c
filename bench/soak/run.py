"""`bench soak`: hours, not minutes — a long mixed workload through the gateway, watching the whole stack.

    1. check the inputs (exit 2; every URL must be loopback: the soak injects faults and loads what it
       talks to), that the gateway serves the model and the cloud simulator's control API answers (exit 1)
    2. `concurrency` workers in a closed loop send the mixed requests of bench/soak/load.py (streamed
       and not, a share pinned to the cloud region) until `duration_s` has passed; a probe at
       temperature 0 every `probe_every_s`; fault episodes in the cloud simulator (bounded in time and
       count); then no new requests, `drain_s` for the ones in flight (still running then: cancelled)
    3. every `sample_s`: RSS and open FDs of every process of the stack (bench/soak/procs.py) and the
       model replicas' precision / numerics / fault (`GET /v1/spillover/cluster`), with a progress
       line on stderr: elapsed, requests, errors, lost, wrong, the current window's p99, RSS
    4. the report (bench/soak/report.py): windows, growth per process, verdicts (bench/soak/metrics.py)

SIGINT / SIGTERM stop the run early: the report so far is written (a second Ctrl-C aborts at once).
Exit code 0 when every verdict passed, 1 when one failed (or was not judged) or a URL is unreachable,
2 on bad input.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import random
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx

from bench.calibrate.report import environment, progress_printer
from bench.factual.run import engine_in
from bench.load.loadgen import BadBaseUrl, check_base_url, make_client
from bench.load.request_result import CANCELLED, RequestResult
from bench.load.target import BenchError, preflight
from bench.load.workload import LengthDist, RequestFactory, WorkloadError, WorkloadSpec
from bench.soak.load import FAULT_NAMES, FaultEpisode, FaultPlan, SoakTraffic, TrafficMix, fault_episodes
from bench.soak.metrics import ProcSample, SoakRequest, window_bounds
from router.percentile import linear_percentile

if TYPE_CHECKING:
    from bench.soak.report import SoakRun

Sampler = Callable[[float], list[ProcSample]]
ERROR_PAUSE_S = 0.5  # a worker waits this long after a failed request before its next one


class SoakError(BenchError):
    pass


@dataclass(frozen=True)
class SoakOptions:
    url: str
    model: str
    concurrency: int
    concurrency_source: str = "--concurrency"
    duration_s: float = 1800.0
    sample_s: float = 30.0
    window_s: float = 300.0
    mix: TrafficMix = field(default_factory=TrafficMix)
    prompt: str = "uniform:20-200"
    output: str = "uniform:8-64"
    prefix_share: float = 0.3
    sim_url: str | None = None  # the cloud simulator (its control API); None: no faults
    faults: FaultPlan = field(default_factory=FaultPlan)
    probe_every_s: float = 60.0
    drain_s: float = 60.0
    growth_limit: float = 0.05
    p99_ratio: float = 1.5
    api_key: str | None = field(default=None, repr=False)
    seed: int = 0
    out_dir: str | None = None
    progress: bool = True


@dataclass
class SoakState:
    """What the run collected so far (the report is written from it, also after an interrupt)."""

    requests: list[SoakRequest] = field(default_factory=list)
    samples: list[ProcSample] = field(default_factory=list)
    replicas: list[dict[str, Any]] = field(default_factory=list)  # {t, replicas: [...]} per sample
    episodes: list[FaultEpisode] = field(default_factory=list)
    end_s: float = 0.0
    interrupted: str | None = None


def _loopback(url: str, what: str) -> str:
    try:
        checked = check_base_url(url)
    except BadBaseUrl as exc:
        raise SoakError(f"{what}: {exc}", 2) from None
    host = urlsplit(checked).hostname or ""
    try:
        ok = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        ok = False
    if not ok:
        raise SoakError(f"{what}: the soak talks only to loopback (127.0.0.0/8, ::1, localhost), not {host!r}", 2)
    return checked


def check_options(o: SoakOptions) -> WorkloadSpec:
    problems = []
    positive = ("duration_s", "sample_s", "window_s", "probe_every_s", "p99_ratio")
    problems += [f"{name} must be > 0" for name in positive if not getattr(o, name) > 0]
    if o.concurrency < 1:
        problems.append("concurrency must be >= 1")
    if o.drain_s < 0 or o.growth_limit < 0:
        problems.append("drain_s and growth_limit must be >= 0")
    for name in ("stream_share", "cloud_share"):
        if not 0 <= getattr(o.mix, name) <= 1:
            problems.append(f"{name} must be in [0, 1]")
    plan = o.faults
    if not plan.faults or any(f not in FAULT_NAMES for f in plan.faults):
        problems.append(f"faults must be some of {', '.join(FAULT_NAMES)}")
    if not 0 < plan.rate <= 1 or plan.every_s <= 0 or plan.duration_s <= 0 or plan.max_episodes < 0:
        problems.append("fault rate must be in (0, 1], fault periods > 0, episodes >= 0")
    if problems:
        raise SoakError("; ".join(problems), 2)
    try:
        return WorkloadSpec(LengthDist.parse(o.prompt), LengthDist.parse(o.output), prefix_share=o.prefix_share)
    except WorkloadError as exc:
        raise SoakError(str(exc), 2) from None


async def _replicas(client: httpx.AsyncClient, base: str, model: str) -> list[dict[str, Any]]:
    try:
        response = await client.get(f"{base}/v1/spillover/cluster")
        rows = response.json().get("replicas") if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        rows = None
    if not isinstance(rows, list):
        return []
    keys = ("replica_id", "precision", "cpu_class", "numerics", "fault")
    return [{k: r.get(k) for k in keys} for r in rows if isinstance(r, dict) and r.get("model") == model]


def _progress_line(o: SoakOptions, state: SoakState, now: float) -> str:
    reqs = [r for r in state.requests if r.kind != "probe"]
    errors = sum(1 for r in state.requests if not r.result.ok and not r.result.cancelled)
    lost = sum(1 for r in state.requests if r.lost)
    wrong = sum(1 for r in state.requests if r.wrong)
    window_start = (now // o.window_s) * o.window_s
    recent = [r.result.e2e_s for r in reqs if r.result.ok and r.result.end_s >= window_start]
    p99 = linear_percentile(recent, 99)
    latest = [s for s in state.samples if s.t == now]
    rss = sum(s.rss_bytes for s in latest) / 2**30
    numerics = sorted(
        {
            f"{r.get('numerics')}" + (f" fault {r['fault']}" if r.get("fault") else "")
            for r in (state.replicas[-1]["replicas"] if state.replicas else [])
        }
    )
    return (
        f"[soak {now:6.0f}s/{o.duration_s:.0f}s] {len(reqs)} requests, {errors} errors, {lost} lost, {wrong} wrong, "
        f"p99 {'–' if p99 is None else f'{p99:.3g} s'} (window {int(now // o.window_s)}), "
        f"RSS {rss:.2f} GiB in {len(latest)} processes, numerics {', '.join(numerics) or '–'}"
    )


async def _sample(
    state: SoakState, sampler: Sampler, client: httpx.AsyncClient, base: str, o: SoakOptions, now: float
) -> None:
    state.samples += await asyncio.to_thread(sampler, now)
    state.replicas.append({"t": now, "replicas": await _replicas(client, base, o.model)})


async def run_soak_async(
    o: SoakOptions,
    *,
    sampler: Sampler,
    transport: httpx.AsyncBaseTransport | None = None,
    install_signals: bool = True,
    clock: Callable[[], float] | None = None,
) -> SoakState:
    """Run the soak (module docstring) and return what it collected."""
    workload = check_options(o)
    url = _loopback(o.url, "--url")
    sim = _loopback(o.sim_url, "--sim").removesuffix("/v1") if o.sim_url else None
    say = progress_printer(o.progress)
    clock = clock or time.monotonic
    client = make_client(url, transport=transport, api_key=o.api_key, read_timeout_s=o.mix.request_timeout_s)
    control = httpx.AsyncClient(timeout=10.0, trust_env=False, follow_redirects=False)
    state, stop = SoakState(), asyncio.Event()
    loop = asyncio.get_running_loop()
    handled: list[signal.Signals] = []

    def on_signal(signum: int) -> None:
        state.interrupted = signal.Signals(signum).name
        say(f"{state.interrupted}: stopping, writing the report so far (again to abort)")
        stop.set()
        for sig in handled:
            loop.remove_signal_handler(sig)

    try:
        await preflight(client, url, o.model, SoakError)
        original: dict[str, Any] = {}
        if sim is not None:
            try:
                response = await control.get(f"{sim}/control/faults")
                response.raise_for_status()
                original = response.json()
            except (httpx.HTTPError, ValueError) as exc:
                raise SoakError(f"the cloud simulator's control API at {sim} does not answer ({exc})", 1) from None
        if install_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, on_signal, sig)
                handled.append(sig)
        rng = random.Random(o.seed)
        traffic = SoakTraffic(client, o.model, o.mix, RequestFactory(workload, rng), rng=rng, clock=clock)
        say(
            f"soak: {o.concurrency} in flight ({o.concurrency_source}) for {o.duration_s:.0f}s through {url}; "
            f"faults {'into ' + sim if sim else 'off (no --sim)'}"
        )
        tasks = [asyncio.create_task(_worker(traffic, state, stop)) for _ in range(o.concurrency)]
        tasks.append(asyncio.create_task(_probes(traffic, state, stop, o.probe_every_s)))
        faulting = []  # never cancelled: on `stop` an episode ends at once and puts the simulator's settings back
        if sim is not None and o.faults.max_episodes:
            episodes = fault_episodes(control, sim, o.faults, original, stop, traffic.elapsed, state.episodes)
            faulting.append(asyncio.create_task(episodes))
        base = url.removesuffix("/v1")
        next_sample = 0.0
        while True:
            now = traffic.elapsed()
            await _sample(state, sampler, client, base, o, now)
            say(_progress_line(o, state, now))
            next_sample += o.sample_s
            if stop.is_set() or traffic.elapsed() >= o.duration_s:
                break
            wait = min(next_sample, o.duration_s) - traffic.elapsed()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=max(0.0, wait))
        stop.set()
        if faulting:
            await asyncio.wait(faulting)
        _, pending = await asyncio.wait(tasks, timeout=0 if state.interrupted else o.drain_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        state.end_s = traffic.elapsed()
        await _sample(state, sampler, client, base, o, state.end_s)
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
        await client.aclose()
        await control.aclose()
    return state


async def _worker(traffic: SoakTraffic, state: SoakState, stop: asyncio.Event) -> None:
    while not stop.is_set():
        item, kind, share = traffic.draw()
        start = traffic.elapsed()
        try:
            sent = await traffic.send(item, kind, share)
        except asyncio.CancelledError:
            cut = RequestResult(item.index, start, traffic.elapsed() - start, error=CANCELLED)
            state.requests.append(SoakRequest(kind, share, cut))
            raise
        state.requests.append(sent)
        if not sent.result.ok:  # a client backs off: a gateway that is down is not hammered in a tight loop
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=ERROR_PAUSE_S)


async def _probes(traffic: SoakTraffic, state: SoakState, stop: asyncio.Event, every_s: float) -> None:
    index = 0
    while not stop.is_set():
        index += 1
        state.requests.append(await traffic.probe(-index))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=every_s)


@dataclass(frozen=True)
class SoakOutcome:
    run: SoakRun
    paths: dict[str, Path]

    @property
    def exit_code(self) -> int:
        return 0 if all(v.passed for v in self.run.verdicts) else 1


def run_soak(o: SoakOptions, *, sampler: Sampler | None = None, **kwargs: Any) -> SoakOutcome:
    """The whole command: run, then write the report (also after SIGINT / SIGTERM)."""
    from bench.soak.procs import ProcessSampler
    from bench.soak.report import SoakRun, write_soak_report

    started = datetime.now(UTC)
    if sampler is None:
        sim_port = urlsplit(o.sim_url).port if o.sim_url else None
        sampler = ProcessSampler(sim_port=sim_port).sample
    state = asyncio.run(run_soak_async(o, sampler=sampler, **kwargs))
    out = Path(o.out_dir) if o.out_dir else Path("bench/results") / f"soak-{o.model}-{started:%Y%m%d-%H%M%S}"
    opts = {k: v for k, v in asdict(o).items() if k != "api_key"}
    judged_until = max(min(state.end_s, o.duration_s), 1e-9)  # what ends in the drain counts in the last window
    bounds = window_bounds(o.window_s, judged_until)
    engine = next((engine_in(sample) for sample in state.replicas if engine_in(sample)), None)
    env = {**environment(), **({"engine": engine} if engine else {})}
    run = SoakRun(opts, started.isoformat(timespec="seconds"), state, bounds, env)
    return SoakOutcome(run, write_soak_report(run, out))
