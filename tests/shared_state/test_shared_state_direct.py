"""The gateway replicas' own listener (`gateway.direct_port`) with three replicas on two nodes.

Every replica binds the one port (SO_REUSEPORT: the kernel spreads new connections over the listening
sockets), so the port is one address whichever replicas run; the checks read the sockets themselves
(`ss`, with the owning process) and call through the official `openai` client. The last test scales
the gateway down to two while a client keeps calling the port: the replica that goes closes its listener
first and finishes what it holds, so no call fails — on a node set as docs/architecture.md asks of gateway
nodes that use the port (`net.ipv4.tcp_migrate_req=1`: the connections the kernel had queued on the closing
listener go to another replica's; without it they are reset, which failed this test now and then). It runs last
(this file sorts after test_shared_state.py), because it leaves two replicas.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from ray.util.state import list_actors

from tests.shared_state.conftest import GATEWAYS, MAIN_KEY, MODEL, Shared

pytestmark = pytest.mark.integration
CLOUD = {"x-spillover-residency": "local-sim"}  # the cloud-sim's region, where the local model is not


def gateway_pids() -> set[int]:
    actors = list_actors(filters=[("state", "=", "ALIVE")], limit=1000, detail=True)
    return {int(a.pid) for a in actors if "Gateway" in (a.class_name or "") and a.pid}


def socket_owners(port: int, state: str) -> Counter[int]:
    """PID -> how many TCP sockets of `port` (as the local end) it holds in `state` (`listening`, `established`)."""
    out = subprocess.run(
        ["ss", "-tnpH", "state", state, f"( sport = :{port} )"], capture_output=True, text=True, check=True
    ).stdout
    return Counter(int(pid) for pid in re.findall(r"pid=(\d+)", out))


def direct_client(shared: Shared) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{shared.direct_url}/v1", api_key=MAIN_KEY, max_retries=0, timeout=60)


def test_every_gateway_replica_listens_on_the_one_direct_port(shared: Shared) -> None:
    port = shared.config.gateway.direct_port
    assert port is not None
    pids = gateway_pids()
    assert len(pids) == GATEWAYS, pids
    assert set(socket_owners(port, "listening")) == pids


def test_connections_to_the_port_spread_over_the_replicas_and_each_answers(shared: Shared) -> None:
    """Twelve streams held open at once, each on a connection of its own: more than one replica holds them
    (twelve on one of three would be a 1-in-177,000 chance), and every stream ends with its answer."""
    port = shared.config.gateway.direct_port
    assert port is not None
    opened, release = threading.Barrier(13), threading.Event()
    texts: list[str] = []

    def one(i: int) -> None:
        stream = direct_client(shared).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Count to ten, stream {i}."}],
            max_tokens=8,
            stream=True,
            extra_headers=CLOUD,
        )
        chunks = iter(stream)
        first = next(chunks)
        opened.wait(60)
        release.wait(60)
        texts.append("".join(c.choices[0].delta.content or "" for c in [first, *chunks] if c.choices))

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(12)]
    for thread in threads:
        thread.start()
    opened.wait(60)
    holders = socket_owners(port, "established")
    release.set()
    for thread in threads:
        thread.join(60)
    assert len(texts) == 12 and all(texts), texts
    assert sum(holders.values()) >= 12, holders
    assert set(holders) <= gateway_pids() and len(holders) >= 2, holders


MIGRATE_REQ = Path("/proc/sys/net/ipv4/tcp_migrate_req")


@pytest.fixture
def migrating_node() -> Iterator[None]:
    """This machine's network namespace set as a gateway node should be (module docstring), put back after."""
    if not MIGRATE_REQ.exists():
        pytest.skip("this kernel has no net.ipv4.tcp_migrate_req (Linux >= 5.14): queued connections would reset")
    before = MIGRATE_REQ.read_text().strip()
    try:
        MIGRATE_REQ.write_text("1")
    except OSError as exc:
        pytest.skip(f"cannot set net.ipv4.tcp_migrate_req=1 here ({exc.strerror}): run as root, or set it")
    try:
        yield
    finally:
        MIGRATE_REQ.write_text(before)


@pytest.mark.usefixtures("migrating_node")
def test_a_gateway_replica_scaled_away_drains_while_clients_call_the_port(shared: Shared) -> None:
    from serve_apps.runner import deploy

    before = gateway_pids()
    failures: list[str] = []
    answered = 0
    stop = threading.Event()

    def call_in_a_loop() -> None:
        nonlocal answered
        while not stop.is_set():
            try:  # a connection of its own each time: the kernel picks a listening replica for each
                response = httpx.post(
                    f"{shared.direct_url}/v1/chat/completions",
                    json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
                    headers={"authorization": f"Bearer {MAIN_KEY}", **CLOUD},
                    timeout=60,
                )
                if response.status_code == 200:
                    answered += 1
                else:
                    failures.append(f"HTTP {response.status_code}: {response.text[:200]}")
            except httpx.HTTPError as exc:
                failures.append(f"{type(exc).__name__}: {exc}")

    callers = [threading.Thread(target=call_in_a_loop, daemon=True) for _ in range(3)]
    for caller in callers:
        caller.start()
    fewer = shared.config.model_copy(
        update={"gateway": shared.config.gateway.model_copy(update={"replicas": GATEWAYS - 1})}
    )
    deploy(fewer, "tests/shared_state", lambda _: None)  # the fixture's config path: only the count changes
    deadline = time.monotonic() + 90
    while len(gateway_pids()) > GATEWAYS - 1 and time.monotonic() < deadline:
        time.sleep(0.5)  # the replica going away drains what it holds, then exits
    time.sleep(2)
    stop.set()
    for caller in callers:
        caller.join(90)
    after = gateway_pids()
    port = shared.config.gateway.direct_port
    assert port is not None
    assert not failures, failures[:5]
    assert answered > 0
    assert len(after) == GATEWAYS - 1 and after < before, (before, after)  # two kept, one drained and gone
    assert set(socket_owners(port, "listening")) == after
