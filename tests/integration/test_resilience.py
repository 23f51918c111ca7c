"""Resilience on the real stack: the fault matrix against cloud-sim, a provider whose
key is refused, and Idempotency-Key. The fault matrix leaves the sims fault-free (each fault is
cleared after its run) and the gateway's resilience state reset, whatever tests run after it.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path

import httpx
import pytest

from bench.calibrate.report import environment
from bench.gateway.faults import FaultOptions, FaultRun, markdown_table, run_matrix, write_fault_report
from tests.integration.conftest import BAD_KEY, SPARE_KEY, Stack, ray_logs

pytestmark = pytest.mark.integration
SMOL = "smollm2-135m-instruct"
SHORT = [{"role": "user", "content": "Say something."}]


def _resilience(stack: Stack) -> dict:
    return httpx.get(f"{stack.base_url}/v1/spillover/resilience", timeout=10).json()


def test_a_refused_key_turns_its_provider_black_and_is_never_printed(stack: Stack, tmp_path: Path) -> None:
    deadline = time.monotonic() + 25  # liveness probes run every 10 s (an earlier test may have reset health)
    while time.monotonic() < deadline:
        health = _resilience(stack)["health"].get("cloud:cloud-sim-badkey", {})
        if health.get("state") == "black":
            break
        time.sleep(0.2)
    assert health.get("state") == "black", health
    assert "provider_auth_failed" in health["reason"]
    request_id = f"badkey-{uuid.uuid4().hex}"
    response = httpx.post(
        f"{stack.openai_base}/chat/completions",
        json={"model": SMOL, "messages": SHORT, "max_tokens": 4},
        headers={"x-request-id": request_id, "x-spillover-providers": "cloud-sim-badkey"},
        timeout=60,
    )
    # local room exists, so it is answered locally; the record lists the black provider as unavailable
    assert response.status_code == 200, response.text
    record = httpx.get(f"{stack.openai_base}/spillover/decisions/{request_id}", timeout=10).json()
    unavailable = {c["target"]: c["reason"] for c in record["candidates"] if c["status"] == "unavailable"}
    assert "black" in unavailable[f"cloud:cloud-sim-badkey/{SMOL}"]
    assert record["health"]["cloud:cloud-sim-badkey"] == "black"
    seen = [response.text, str(record), str(_resilience(stack)), httpx.get(f"{stack.base_url}/metrics").text]
    logs = ray_logs()  # every worker's output, the gateway's included
    seen += [p.read_text(errors="replace") for p in logs.glob("worker-*")] + [p.name for p in logs.glob("*")]
    assert not [text for text in seen if BAD_KEY in text], "the refused key was printed"


def test_idempotency_key_replays_the_first_answer(stack: Stack) -> None:
    key = f"order-{uuid.uuid4().hex}"
    body = {"model": SMOL, "messages": SHORT, "max_tokens": 8, "temperature": 0.9}
    first = httpx.post(f"{stack.openai_base}/chat/completions", json=body, headers={"idempotency-key": key}, timeout=60)
    again = httpx.post(f"{stack.openai_base}/chat/completions", json=body, headers={"idempotency-key": key}, timeout=60)
    assert first.status_code == again.status_code == 200
    assert again.json()["id"] == first.json()["id"]  # the same completion, not a second one
    assert again.headers["x-spillover-idempotent-replay"] == "true"


@pytest.mark.usefixtures("resets_after")
def test_fault_matrix_loses_nothing_and_never_resends_a_started_stream(stack: Stack) -> None:
    options = FaultOptions(
        url=stack.openai_base,
        sims=(stack.sim_url, stack.spare_url),
        model=SMOL,
        requests=8,
        streams=4,
        concurrency=4,
        hang_s=4.0,  # > cloud-sim's timeout_s of 2 s in the test config
        api_key=SPARE_KEY,  # the spare's control routes need its key (the first sim has none)
    )
    rows = asyncio.run(run_matrix(options, lambda line: print(line, flush=True)))
    table = markdown_table(rows)
    print(f"\nfault matrix (faulty cloud-sim, healthy spare cloud-sim-b):\n{table}")
    out = os.environ.get("SPILLOVER_FAULTS_REPORT")
    if out:  # keep a copy (bench/reports/cpu-faults was written this way)
        write_fault_report(FaultRun(options, rows, time.strftime("%Y-%m-%dT%H:%M:%S"), environment()), Path(out))
    for row in rows:
        assert row.json_lost == 0, f"{row.fault}: {row.json_lost} non-streamed requests lost ({row.lost_codes})"
        assert row.stream_resent == 0, f"{row.fault}: a started stream was sent again"
        assert row.stream_broken == 0, f"{row.fault}: a stream ended without a clean error event"
        assert row.faulty_attempts >= 1, f"{row.fault}: the faulty sim was never tried"
    by_fault = {row.fault: row for row in rows}
    assert by_fault["midstream_cut"].stream_clean_error >= 1  # cut after the first token: an error event
    assert by_fault["error_5xx"].other_attempts >= by_fault["error_5xx"].json_sent  # every answer came from b
