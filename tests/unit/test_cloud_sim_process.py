"""The cloud simulator as a real subprocess: the official openai client, a real timeout and cut."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cluster.config.cloud import CloudProvider
from router.errors import TargetUnavailable, UpstreamError
from serve_apps.providers import OpenAICompatProvider
from tests.unit.cloud_sim_client import chat

REPO = Path(__file__).resolve().parents[2]
QUESTION = "What is the capital of France?"
KEYED = {"authorization": "Bearer sk-real-sim"}  # the real sim's key: its /control routes need it too


# -- the real server, as a subprocess ----------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def real_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, Path]]:
    port = _free_port()
    log_path = tmp_path_factory.mktemp("cloud-sim") / "requests.jsonl"
    command = [sys.executable, "-m", "bench.cloud_sim", "--port", str(port), "--log", str(log_path)]
    command += ["--ttft-s", "0.01", "--tokens-per-s", "1000", "--api-key", "sk-real-sim"]
    output_path = log_path.parent / "output.txt"
    output = output_path.open("w")
    proc = subprocess.Popen(command, cwd=REPO, stdout=output, stderr=subprocess.STDOUT, env=os.environ.copy())
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                healthy = httpx.get(f"{base}/healthz", timeout=1).status_code == 200
            except httpx.TransportError:
                healthy = False
            if healthy and f"cloud-sim listening on {base}/v1" in output_path.read_text():
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"cloud-sim did not start: {output_path.read_text()}")
            time.sleep(0.05)
        yield base, log_path, output_path
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        output.close()


def test_real_server_with_the_openai_client(real_sim: tuple[str, Path, Path]) -> None:
    openai = pytest.importorskip("openai")
    base, log_path, _ = real_sim
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-real-sim", timeout=10, max_retries=0)
    try:
        messages = [{"role": "user", "content": QUESTION}]
        completion = client.chat.completions.create(model="sim-smollm2", messages=messages)
        stream = client.chat.completions.create(model="sim-smollm2", messages=messages, stream=True)
        streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    finally:
        client.close()
    assert completion.choices[0].message.content == f"[cloud-sim:sim-smollm2] {QUESTION}"
    assert completion.usage is not None and completion.usage.completion_tokens == 7
    assert streamed == completion.choices[0].message.content
    records = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert [r["stream"] for r in records[-2:]] == [False, True]


async def test_real_server_timeout_and_cut_reach_the_provider_as_errors(real_sim: tuple[str, Path, Path]) -> None:
    base, _, output_path = real_sim
    config = CloudProvider(
        name="real-sim", base_url=f"{base}/v1", api_key_env="SIM_KEY", timeout_s=0.5, models={"local": "sim-smollm2"}
    )
    body = chat(model="local")
    async with (
        httpx.AsyncClient(base_url=base, headers=KEYED) as control,
        OpenAICompatProvider(config, env={"SIM_KEY": "sk-real-sim"}) as provider,
    ):
        try:
            await control.post("/control/faults", json={"timeout_rate": 1.0, "hang_s": 5})
            started = time.monotonic()
            with pytest.raises(TargetUnavailable) as timed_out:
                await provider.chat("local", body, "req-timeout")
            assert timed_out.value.code == "provider_timeout" and time.monotonic() - started < 3
            await control.post("/control/faults", json={"timeout_rate": 0, "midstream_cut_rate": 1.0})
            reply = await provider.chat("local", {**body, "stream": True}, "req-cut")
            assert reply.chunks is not None
            with pytest.raises(UpstreamError) as cut:
                async for _ in reply.chunks:
                    pass
            assert cut.value.code == "provider_cut"
            with pytest.raises(UpstreamError) as cut_json:
                await provider.chat("local", body, "req-cut-json")
            assert cut_json.value.code == "provider_cut"
            for _ in range(100):  # the hung request gives its slot back once the client has gone
                if (await control.get("/control/stats")).json()["inflight"] == 0:
                    break
                await asyncio.sleep(0.05)
            assert (await control.get("/control/stats")).json()["inflight"] == 0
            assert "Traceback" not in output_path.read_text()  # simulated cuts are not logged as crashes
        finally:
            await control.post("/control/reset")


async def test_real_server_reset_drops_the_connection_before_any_byte(real_sim: tuple[str, Path, Path]) -> None:
    base, log_path, output_path = real_sim
    config = CloudProvider(
        name="real-sim", base_url=f"{base}/v1", api_key_env="SIM_KEY", timeout_s=5, models={"local": "sim-smollm2"}
    )
    async with (
        httpx.AsyncClient(base_url=base, headers=KEYED) as control,
        OpenAICompatProvider(config, env={"SIM_KEY": "sk-real-sim"}) as provider,
    ):
        try:
            await control.post("/control/faults", json={"reset_rate": 1.0})
            with pytest.raises(TargetUnavailable) as reset:
                await provider.chat("local", chat(model="local"), "req-reset")
            # no status line ever arrived: a transport failure, not an HTTP error or a cut body
            assert reset.value.code == "provider_unreachable"
            await control.post("/control/reset")
            reply = await provider.chat("local", chat(model="local"), "req-after-reset")
            assert reply.body is not None and reply.status == 200  # the server itself is fine
            rows = (await control.get("/control/log", params={"x_request_id": "req-reset"})).json()["rows"]
            assert [(r["fault"], r["status"]) for r in rows] == [("reset", 0)]
        finally:
            await control.post("/control/reset")
    record = next(json.loads(line) for line in log_path.read_text().splitlines() if "req-reset" in line)
    assert record["fault"] == "reset" and record["status"] == 0
    assert "Traceback" not in output_path.read_text()


def test_cloud_sim_control_requires_key_of_the_real_server(real_sim: tuple[str, Path, Path]) -> None:
    """Started with a key, the real server's /control routes refuse a caller without it: a stranger
    cannot turn faults on for every client, nor read the request log."""
    base, _, _ = real_sim
    steer = {"error_5xx_rate": 1.0}
    refused = [
        httpx.post(f"{base}/control/faults", json=steer, timeout=10),
        httpx.post(f"{base}/control/reset", headers={"authorization": "Bearer wrong"}, timeout=10),
        httpx.get(f"{base}/control/log", timeout=10),
    ]
    assert [r.status_code for r in refused] == [401, 401, 401]
    assert all("sk-real-sim" not in r.text for r in refused)
    shown = httpx.get(f"{base}/control/faults", headers=KEYED, timeout=10)
    assert shown.status_code == 200 and shown.json()["error_5xx_rate"] == 0.0  # nothing changed


def test_a_port_something_listens_on_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """What listened there would answer the start-up /healthz, and the burst meant for this simulator would reach
    it (an earlier `spillover serve --cloud-sim` left behind did): `serve --cloud-sim` stops with one line."""
    from bench.cloud_sim.process import CloudSimError, running_cloud_sim

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CloudSimError, match=f"port {port} is in use"), running_cloud_sim(port, ["m"]):
            raise AssertionError("unreachable")
        config = tmp_path / "config.yaml"
        text = (REPO / "configs/local.yaml").read_text().replace("127.0.0.1:9100/v1", f"127.0.0.1:{port}/v1")
        config.write_text(text)
        done = subprocess.run(
            [sys.executable, "-m", "spillover", "serve", "--config", str(config), "--cloud-sim"],
            cwd=REPO, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert f"error: port {port} is in use on 127.0.0.1" in done.stderr and "Traceback" not in done.stderr, done.stderr
