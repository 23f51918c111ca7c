"""A local stream broken mid-answer is finished in the cloud, on the real stack (docs/resilience.md, "Streams that
finish"): the engine of `qwen2-tiny-random` is killed (SIGKILL of its `VLLM::` processes: an engine that died), or
frozen (SIGSTOP: one that wedged, which its replica finds within `stall_s` and kills) while it streams an answer
of the default scenario (L2, which continues broken streams). The client reads one answer: the local chunks, then
a prefill-capable cloud-sim's, under the first stream's id, and the last chunk before `[DONE]` says where it was
spliced; no error event. Each test leaves one fresh replica (tests/integration/test_engine_faults.py's fixture).
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from typing import Any

import httpx
import pytest

from tests.integration.conftest import Stack, final_record
from tests.integration.qwen_load import QWEN, SHORT, numerics_check_window_s
from tests.integration.test_engine_faults import _one_replica, _wait_for, engine_processes, fresh_replica_after

pytestmark = pytest.mark.integration
__all__ = ["fresh_replica_after"]  # the fixture, used by name


def broken_local_stream(stack: Stack, sig: signal.Signals) -> tuple[str, list[dict[str, Any]], str]:
    """A long local stream whose engine gets `sig` once the first chunk arrived: its request id, its events (the
    JSON payloads) and how it ended. Sent again while the model's own numerics check makes it read saturated (it
    then bursts at once: tests/integration/qwen_load.py)."""
    deadline = time.monotonic() + numerics_check_window_s(stack)
    body = {"model": QWEN, "messages": SHORT, "max_tokens": 400, "ignore_eos": True, "stream": True}
    while True:
        request_id = f"hybrid-{sig.name}-{uuid.uuid4().hex}"
        events: list[dict[str, Any]] = []
        with httpx.stream(
            "POST", f"{stack.openai_base}/chat/completions", json=body, headers={"x-request-id": request_id},
            timeout=300,
        ) as response:  # fmt: skip
            assert response.status_code == 200, response.read()
            if response.headers["x-spillover-route"] != "local":
                assert time.monotonic() < deadline, response.headers["x-spillover-reason"]
                response.read()
                time.sleep(0.5)
                continue
            ended = "no [DONE]"
            for line in response.iter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    ended = "[DONE]"
                    break
                events.append(json.loads(line.removeprefix("data: ")))
                if len(events) == 2:  # the role chunk and a first token: the engine is mid-answer
                    engines = engine_processes(QWEN)
                    assert engines, "no engine processes under the qwen replica"
                    for proc in engines:
                        proc.send_signal(sig)
            return request_id, events, ended


@pytest.mark.usefixtures("fresh_replica_after")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["engine-died", "engine-wedged"])
def test_a_local_stream_cut_mid_answer_is_finished_in_the_cloud(stack: Stack, sig: signal.Signals) -> None:
    before = _one_replica(stack)["replica_id"]
    request_id, events, ended = broken_local_stream(stack, sig)
    # Serve replaces the replica whose engine is gone: wait for the new one here (the fixture alone could take the
    # dying replica's last fresh reading for it)
    _wait_for(
        stack,
        lambda r: r["replica_id"] != before and not r["stale"] and r["numerics"] == "passed",
        stack.config.gateway.readiness_timeout_s,
        "a new replica",
    )
    assert ended == "[DONE]" and not any("error" in e for e in events), events[-3:]
    assert len({e["id"] for e in events}) == 1  # one answer: the continuation's chunks carry the first stream's id
    (marker,) = [e["spillover"] for e in events if "spillover" in e]
    assert marker["continued"] is True and marker["from"] == f"local:{QWEN}", marker
    assert marker["to"].startswith("cloud:") and marker["splice_after_chunks"] >= 1, marker
    assert events[-1].get("spillover") == marker or events[-2].get("spillover") == marker  # last, or before usage
    record = final_record(stack, request_id)
    (continued,) = [e for e in record["events"] if e["kind"] == "continued"]
    assert (continued["from"], continued["to"]) == (marker["from"], marker["to"])
    outcomes = [(a["target"], a["outcome"]) for a in record["attempts"]]
    assert outcomes[0] == (f"local:{QWEN}", "cut") and outcomes[-1] == (marker["to"], "ok"), outcomes
