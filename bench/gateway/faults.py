"""`bench faults`: the fault matrix — one cloud-sim fault at a time, what the clients saw.

For each fault in {error_5xx, rate_limit, timeout, reset, midstream_cut, malformed} the faulty
cloud-sim (the first `--sim`, which the gateway must rank first for the requests sent) is set to
inject it into every request; then `requests` non-streamed and `streams` streamed tool requests
go through the gateway, its resilience state reset before each of the two groups (so that the
streams meet the fault, not a breaker the non-streamed requests opened). Counted per fault:

    json ok / lost         a non-streamed request is lost when the client did not get a 200
                           answer (0 expected while another capable target is healthy)
    stream ok              the stream ended with `[DONE]` and no error event
    stream clean error     an error event, then `[DONE]` (a cut after the first token)
    stream broken          anything else: a dropped connection, a non-200 status, no `[DONE]`
    stream re-sent         a stream that had started on a sim (its log says status 200) and
                           appears again in any sim's log: 0 expected, never a second answer
    attempts on the faulty sim / on the others   from the sims' own request logs

The sims' logs are read over HTTP (`GET /control/log?x_request_id=`), so the bench needs no
access to their files. Requests carry a tool so that the local model (no tools) is never a
candidate: they go to the cloud targets only.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import httpx

from bench.load.target import BenchError
from router import headers as hdr

FAULTS: tuple[str, ...] = ("error_5xx", "rate_limit", "timeout", "reset", "midstream_cut", "malformed")
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@dataclass(frozen=True)
class FaultOptions:
    url: str  # the gateway's OpenAI base, .../v1
    sims: tuple[str, ...]  # cloud-sim base URLs; the first is the faulty one
    model: str
    faults: tuple[str, ...] = FAULTS
    requests: int = 12
    streams: int = 4
    concurrency: int = 4
    hang_s: float = 5.0  # timeout fault: longer than the gateway's provider timeout_s
    retry_after_s: float = 2.0  # rate_limit fault
    request_timeout_s: float = 60.0
    api_key: str | None = None


@dataclass
class FaultRow:
    fault: str
    json_sent: int = 0
    json_ok: int = 0
    json_lost: int = 0
    stream_sent: int = 0
    stream_ok: int = 0
    stream_clean_error: int = 0
    stream_broken: int = 0
    stream_resent: int = 0
    faulty_attempts: int = 0
    other_attempts: int = 0
    seconds: float = 0.0
    lost_codes: dict[str, int] = field(default_factory=dict)
    faulty_state_after: str = ""

    @property
    def passed(self) -> bool:
        return self.json_lost == 0 and self.stream_resent == 0 and self.stream_broken == 0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed}


def _base(url: str) -> str:
    return url.rstrip("/").removesuffix("/v1")


def _body(model: str, stream: bool) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [TOOL],
        "max_tokens": 16,
        "stream": stream,
    }


async def _json_request(client: httpx.AsyncClient, opts: FaultOptions, request_id: str) -> str:
    """'ok' or the error code / status the client got."""
    try:
        response = await client.post(
            f"{opts.url}/chat/completions", json=_body(opts.model, False), headers={hdr.REQUEST_ID: request_id}
        )
    except httpx.HTTPError as exc:
        return f"transport:{type(exc).__name__}"
    if response.status_code == 200 and response.json().get("choices"):
        return "ok"
    try:
        return str(response.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return f"http_{response.status_code}"


async def _stream_request(client: httpx.AsyncClient, opts: FaultOptions, request_id: str) -> str:
    """'ok', 'clean_error' or 'broken'."""
    events: list[str] = []
    try:
        async with client.stream(
            "POST",
            f"{opts.url}/chat/completions",
            json=_body(opts.model, True),
            headers={hdr.REQUEST_ID: request_id},
        ) as response:
            if response.status_code != 200:
                return "broken"
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
    except httpx.HTTPError:
        return "broken"
    if not events or events[-1] != "[DONE]":
        return "broken"
    errors = [e for e in events[:-1] if '"error"' in e and _is_error(e)]
    return "clean_error" if errors else "ok"


def _is_error(data: str) -> bool:
    try:
        event = json.loads(data)
    except ValueError:
        return False
    return isinstance(event, dict) and "error" in event


async def _sim_rows(client: httpx.AsyncClient, sim: str, request_id: str) -> list[dict[str, Any]]:
    response = await client.get(f"{_base(sim)}/control/log", params={"x_request_id": request_id})
    response.raise_for_status()
    return list(response.json()["rows"])


_T = TypeVar("_T")


async def _bounded(concurrency: int, jobs: Sequence[Callable[[], Awaitable[_T]]]) -> list[_T]:
    gate = asyncio.Semaphore(concurrency)

    async def one(job: Callable[[], Awaitable[_T]]) -> _T:
        async with gate:
            return await job()

    return await asyncio.gather(*(one(job) for job in jobs))


async def _reset_gateway(client: httpx.AsyncClient, gateway: str) -> None:
    reset = await client.post(f"{gateway}/v1/spillover/resilience/reset")
    if reset.status_code != 200:
        raise BenchError(f"the gateway refused POST /v1/spillover/resilience/reset (HTTP {reset.status_code})")


async def run_fault(client: httpx.AsyncClient, opts: FaultOptions, fault: str) -> FaultRow:
    faulty, gateway = _base(opts.sims[0]), _base(opts.url)
    row = FaultRow(fault)
    began = time.monotonic()
    for sim in opts.sims:
        (await client.post(f"{_base(sim)}/control/reset")).raise_for_status()
    await _reset_gateway(client, gateway)
    settings: dict[str, Any] = {f"{fault}_rate": 1.0, "hang_s": opts.hang_s, "retry_after_s": opts.retry_after_s}
    (await client.post(f"{faulty}/control/faults", json=settings)).raise_for_status()
    try:
        tag = uuid.uuid4().hex[:8]
        json_ids = [f"faults-{fault}-json-{i}-{tag}" for i in range(opts.requests)]
        stream_ids = [f"faults-{fault}-stream-{i}-{tag}" for i in range(opts.streams)]
        json_results = await _bounded(opts.concurrency, [partial(_json_request, client, opts, i) for i in json_ids])
        await _reset_gateway(client, gateway)  # the streams meet the fault too, not an already open breaker
        stream_results = await _bounded(
            opts.concurrency, [partial(_stream_request, client, opts, i) for i in stream_ids]
        )
    finally:
        (await client.post(f"{faulty}/control/reset")).raise_for_status()
    row.json_sent, row.stream_sent = len(json_ids), len(stream_ids)
    row.json_ok = json_results.count("ok")
    row.json_lost = row.json_sent - row.json_ok
    for code in json_results:
        if code != "ok":
            row.lost_codes[code] = row.lost_codes.get(code, 0) + 1
    row.stream_ok = stream_results.count("ok")
    row.stream_clean_error = stream_results.count("clean_error")
    row.stream_broken = stream_results.count("broken")
    for request_id in [*json_ids, *stream_ids]:
        per_sim = [await _sim_rows(client, sim, request_id) for sim in opts.sims]
        row.faulty_attempts += len(per_sim[0])
        row.other_attempts += sum(len(rows) for rows in per_sim[1:])
        if request_id in stream_ids:
            rows = sorted((r for rows in per_sim for r in rows), key=lambda r: r.get("time", 0))
            started = next((k for k, r in enumerate(rows) if r.get("status") == 200), None)
            if started is not None and started < len(rows) - 1:
                row.stream_resent += 1
    view = (await client.get(f"{gateway}/v1/spillover/resilience")).json()
    row.faulty_state_after = ", ".join(f"{k}={v['state']}" for k, v in view.get("health", {}).items() if "cloud" in k)
    row.seconds = time.monotonic() - began
    return row


async def run_matrix(opts: FaultOptions, progress: Callable[[str], None] = lambda _: None) -> list[FaultRow]:
    headers = {"authorization": f"Bearer {opts.api_key}"} if opts.api_key else {}
    async with httpx.AsyncClient(timeout=opts.request_timeout_s, headers=headers) as client:
        for sim in opts.sims:
            try:
                (await client.get(f"{_base(sim)}/control/stats")).raise_for_status()
            except httpx.HTTPError as exc:
                raise BenchError(f"cloud-sim control API at {_base(sim)} is not reachable ({exc})") from None
        rows = []
        for n, fault in enumerate(opts.faults, 1):
            progress(f"[{n}/{len(opts.faults)}] {fault} ...")
            row = await run_fault(client, opts, fault)
            verdict = "ok" if row.passed else "FAILED"
            progress(
                f"[{n}/{len(opts.faults)}] {fault}: json {row.json_ok}/{row.json_sent} ok, streams "
                f"{row.stream_ok} ok + {row.stream_clean_error} clean errors, {row.stream_resent} re-sent "
                f"({row.seconds:.1f}s) {verdict}"
            )
            rows.append(row)
        return rows


def markdown_table(rows: Sequence[FaultRow]) -> str:
    lines = [
        "| fault | json ok | json lost | streams ok | stream clean errors | streams broken | streams re-sent "
        "| attempts on faulty sim | attempts elsewhere | seconds | cloud health after |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lost = f"{r.json_lost}" + (
            f" ({', '.join(f'{k}×{v}' for k, v in r.lost_codes.items())})" if r.lost_codes else ""
        )
        lines.append(
            f"| {r.fault} | {r.json_ok}/{r.json_sent} | {lost} | {r.stream_ok}/{r.stream_sent} | "
            f"{r.stream_clean_error} | {r.stream_broken} | {r.stream_resent} | {r.faulty_attempts} | "
            f"{r.other_attempts} | {r.seconds:.1f} | {r.faulty_state_after} |"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class FaultRun:
    options: FaultOptions
    rows: list[FaultRow]
    started_at: str
    environment: dict[str, Any]

    @property
    def exit_code(self) -> int:
        return 0 if all(r.passed for r in self.rows) else 1

    def to_dict(self) -> dict[str, Any]:
        opts = {k: v for k, v in asdict(self.options).items() if k != "api_key"}
        return {
            "started_at": self.started_at,
            "options": opts,
            "rows": [r.to_dict() for r in self.rows],
            "environment": self.environment,
        }


def render_markdown(run: FaultRun) -> str:
    from bench.calibrate.report import environment_and_plots

    o = run.options
    lines = [
        f"# Fault matrix — `{o.model}` through {o.url}",
        "",
        f"Started {run.started_at}. Faulty cloud-sim {o.sims[0]} (every request gets the fault), other targets: "
        f"{', '.join(o.sims[1:]) or 'none'}. Per fault: {o.requests} non-streamed and {o.streams} streamed tool "
        f"requests, {o.concurrency} at a time; the gateway's resilience state reset before each group.",
        "",
        markdown_table(run.rows),
        "",
        "A non-streamed request is *lost* when its client got no 200 answer. A stream is *re-sent* when it had "
        "started (status 200 in a sim's log) and reached a sim again. *Clean error*: the stream ended with an "
        "OpenAI error event and `[DONE]` after the fault cut it — never re-sent, as promised.",
        *environment_and_plots(run.environment, []),
    ]
    return "\n".join(lines) + "\n"


def write_fault_report(run: FaultRun, out_dir: Path) -> dict[str, Path]:
    from bench.calibrate.report import write_results

    return write_results(out_dir, run.to_dict(), render_markdown(run))


def run_faults(opts: FaultOptions, out_dir: Path | None, *, progress: bool = True) -> FaultRun:
    """The whole command: run the matrix, write the report (when `out_dir`), return the run."""
    from bench.calibrate.report import environment, progress_printer

    started = datetime.now(UTC).isoformat(timespec="seconds")
    rows = asyncio.run(run_matrix(opts, progress_printer(progress)))
    run = FaultRun(opts, rows, started, environment())
    if out_dir is not None:
        write_fault_report(run, out_dir)
    return run


def summary_lines(run: FaultRun) -> list[str]:
    verdict = "no request lost, no stream re-sent" if run.exit_code == 0 else "FAILURES (see the table)"
    return [markdown_table(run.rows), "", f"fault matrix: {verdict}"]
