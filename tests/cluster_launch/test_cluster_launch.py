"""`ray up` for real: ray-cluster.yaml on two SSH hosts, `spillover deploy`, Ray's `serve deploy`, `ray down`.

The hosts are network namespaces with their own sshd (tests/cluster_launch/testhosts.py); the
cluster config is ray-cluster.yaml with only the hosts, user, key and checkout location changed
(tests/cluster_launch/launch_config.py). The head has 1 CPU and the worker 4 (each host's profile
says so, as a machine's hardware would), and the model replica asks for 2: Ray can only place it
on the worker. The steps run in order and share one cluster; each asserts on what Ray reports or
on the model's answer through the gateway, called with the official `openai` client.

A process of its own (one Ray per process, and the hosts need root): `pytest tests/cluster_launch`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time

import httpx
import pytest
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from tests import http_attacks as attack
from tests.cluster_launch.cluster_report import MARKER
from tests.cluster_launch.conftest import HEAD, REPO, WORKER, Launched, say
from tests.cluster_launch.testhosts import Host

pytestmark = pytest.mark.integration
MODEL = "smollm2-135m-instruct"
GATEWAY = f"http://{HEAD.ip}:8000"  # Serve's proxy (gateway.port)
DIRECT_PORT = 8001  # the gateway replicas' own listener on the head (configs/local.yaml gateway.direct_port)
DIRECT = f"http://{HEAD.ip}:{DIRECT_PORT}"
QUESTION = "What is the capital of France?"
HEAD_REDIS = "--host auto --port 6380 --password-file ~/.spillover/state_password"  # as ray-cluster.yaml starts it


def cluster_report(run: Launched, wait_nodes: int = 0, timeout_s: float = 0) -> dict:
    script = REPO / "tests" / "cluster_launch" / "cluster_report.py"
    output = run.on_head(f"python {script} --wait-nodes {wait_nodes} --timeout-s {timeout_s}", timeout=timeout_s + 120)
    line = next((x for x in output.splitlines() if x.startswith(MARKER)), None)
    assert line, f"no report from the head:\n{output[-3000:]}"
    return json.loads(line[len(MARKER) :])


def model_replicas(report: dict) -> list[dict]:
    return [a for a in report["actors"] if a["class"].startswith("ServeReplica:") and "LLMServer" in a["class"]]


def ask(run: Launched, base: str = DIRECT) -> str:
    client = OpenAI(base_url=f"{base}/v1", api_key=run.tenant_key, timeout=120, max_retries=0)
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": QUESTION}], temperature=0, max_tokens=32
    )
    return reply.choices[0].message.content or ""


def wait_ready(timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            response = httpx.get(f"{GATEWAY}/readyz", timeout=5)
            if response.status_code == 200:
                return
            last = f"{response.status_code} {response.text[:200]}"
        except httpx.HTTPError as exc:
            last = type(exc).__name__
        time.sleep(2)
    raise AssertionError(f"{GATEWAY}/readyz not 200 after {timeout_s:.0f}s: {last}")


@pytest.fixture(scope="module")
def up(launched: Launched) -> Launched:
    started = time.monotonic()
    output = launched.ray("up", "-y", str(launched.config), timeout=600)
    say(f"`ray up` returned after {time.monotonic() - started:.0f}s:\n" + "\n".join(output.splitlines()[-6:]))
    return launched


def test_ray_up_brings_the_head_and_every_worker_into_the_cluster(up: Launched) -> None:
    started = time.monotonic()
    report = cluster_report(up, wait_nodes=2, timeout_s=240)
    alive = {n["ip"]: n for n in report["nodes"] if n["alive"]}
    say(f"nodes alive {time.monotonic() - started:.0f}s after `ray up`: {json.dumps(report['nodes'])}")
    assert set(alive) == {HEAD.ip, WORKER.ip}
    assert alive[HEAD.ip]["head"] and not alive[WORKER.ip]["head"]
    assert (alive[HEAD.ip]["cpus"], alive[WORKER.ip]["cpus"]) == (HEAD.cpus, WORKER.cpus)
    # the worker's raylet joins during its `ray start`; the launcher marks it active once that command
    # returns, so `ray status` may still list it as `setting-up` for a few seconds
    deadline = time.monotonic() + 120
    while True:
        status = up.on_head("ray status", timeout=120)
        assert "Active:" in status
        active = status[status.index("Active:") : status.index("Pending:")]
        if sum(int(line.split()[0]) for line in active.splitlines()[1:] if line.strip()) == 2:
            break
        assert time.monotonic() < deadline, active
        time.sleep(5)
    say("`ray status` on the head:\n" + status[status.find("Node status") :][:1500])


def test_dashboard_listens_on_the_head_loopback_only_and_ray_dashboard_reaches_it(up: Launched) -> None:
    with pytest.raises(OSError):  # not on the head's network address
        socket.create_connection((HEAD.ip, 8265), timeout=3).close()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    tunnel = up.dashboard_tunnel(port)
    base = f"http://127.0.0.1:{port}"
    bearer = {"Authorization": f"Bearer {up.token}"}
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                version = httpx.get(f"{base}/api/version", headers=bearer, timeout=5).json()
                break
            except (httpx.HTTPError, ValueError):
                assert tunnel.poll() is None, "`ray dashboard` exited"
                assert time.monotonic() < deadline, "no dashboard through `ray dashboard`"
                time.sleep(1)
        anonymous = httpx.get(f"{base}/api/version", timeout=10)
        job = httpx.post(f"{base}/api/jobs/", json={"entrypoint": "touch /tmp/spillover-pwned"}, timeout=10)
    finally:  # what Ctrl-C does to `ray dashboard`: signal its whole process group (ray and its ssh)
        os.killpg(tunnel.pid, signal.SIGINT)
        try:
            tunnel.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(tunnel.pid, signal.SIGKILL)
            tunnel.wait(timeout=15)
    say(f"dashboard through `ray dashboard` (127.0.0.1:{port} here -> head loopback): {version}")
    say(f"without the token: /api/version {anonymous.status_code}, job submission {job.status_code}")
    assert version["ray_version"].startswith("2.")
    assert anonymous.status_code == job.status_code == 401  # even through the tunnel, the token is needed


STRANGER_INIT = "import ray; ray.init(address={address!r}, log_to_driver=False); print('CONNECTED')"


def test_ray_ports_refuse_unauthenticated_callers_from_another_namespace(up: Launched) -> None:
    """From the launching machine (another network namespace, on the cluster's network): without the
    token, `ray.init` of the GCS address and of the Ray Client address fails, the GCS refuses `ray
    status`, and every node's agent refuses its job API (401, 403 for a wrong token); with the token
    the same GCS answers and the same agent lets the request through (404: no such job). What Ray lets
    be bound is bound: the dashboard to loopback, the agent's HTTP and the Ray Client to the node's
    address; the GCS, raylet and worker ports listen on every address of the node (Ray 2.60 has no
    option for one address) and are guarded by the token alone."""
    gcs, client = f"{HEAD.ip}:6379", f"ray://{HEAD.ip}:10001"
    started = time.monotonic()
    inits = {address: up.stranger(["python", "-c", STRANGER_INIT.format(address=address)]) for address in (gcs, client)}
    try:
        refused = up.local(["ray", "status", "--address", gcs], timeout=120, token=False)
        allowed = up.local(["ray", "status", "--address", gcs], timeout=120, env={"RAY_AUTH_MODE": "token"})
        say(f"`ray status --address {gcs}` without the token: exit {refused.returncode}; with it: {allowed.returncode}")
        assert refused.returncode != 0
        assert "Authentication token is missing or incorrect" in refused.stdout + refused.stderr
        assert allowed.returncode == 0 and "Node status" in allowed.stdout, allowed.stderr[-2000:]
        for host in (HEAD, WORKER):
            jobs = f"http://{host.ip}:52365/api/job_agent/jobs/"
            submit = {"entrypoint": "touch /tmp/spillover-pwned"}
            anonymous = httpx.post(jobs, json=submit, timeout=10)
            wrong = httpx.post(jobs, json=submit, headers={"Authorization": "Bearer " + "0" * 64}, timeout=10)
            bearer = {"Authorization": f"Bearer {up.token}"}
            known = httpx.get(f"{jobs}no-such-job/logs", headers=bearer, timeout=10)
            statuses = (anonymous.status_code, wrong.status_code, known.status_code)
            say(f"{host.name}'s agent job API without a token, with a wrong one, with the cluster's: {statuses}")
            assert statuses == (401, 403, 404)
        listening = _listening(HEAD)
        say(f"listening on {HEAD.name}: {sorted(listening.items())}")
        assert listening[8265] == {"127.0.0.1"}
        assert not listening[52365] & ANY_ADDRESS and not listening[10001] & ANY_ADDRESS
        for address, init in inits.items():
            output, _ = init.communicate(timeout=240)
            say(f"`ray.init({address!r})` without the token: exit {init.returncode} after "
                f"{time.monotonic() - started:.0f}s: {output.strip().splitlines()[-1:]}")  # fmt: skip
            assert init.returncode != 0 and "CONNECTED" not in output
    finally:
        for init in inits.values():
            if init.poll() is None:
                os.killpg(init.pid, signal.SIGKILL)
                init.wait(timeout=15)


ANY_ADDRESS = {"0.0.0.0", "*", "::"}


def _listening(host: Host) -> dict[int, set[str]]:
    """The TCP ports listening on `host` and the addresses each is bound to (`ss` in its namespace)."""
    done = subprocess.run(
        ["ip", "netns", "exec", host.netns, "ss", "-Hltn"], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    found: dict[int, set[str]] = {}
    for line in done.stdout.splitlines():
        local = line.split()[3]
        address, _, port = local.rpartition(":")
        found.setdefault(int(port), set()).add(address.strip("[]").removeprefix("::ffff:"))
    return found


def test_spillover_deploy_serves_chat_through_the_gateway_with_the_model_on_a_worker(up: Launched) -> None:
    started = time.monotonic()
    output = up.on_head(f"spillover deploy --config {up.spillover_config}", timeout=480)
    said = [line for line in output.splitlines() if line.startswith(("ready after", "deployed:"))]
    say(f"`spillover deploy` on the head took {time.monotonic() - started:.0f}s: {said}")
    for base in (DIRECT, GATEWAY):
        assert httpx.get(f"{base}/v1/models", timeout=10).status_code == 401  # auth is on
        answer = ask(up, base)
        say(f"chat through {base}: {answer!r}")
        assert "paris" in answer.lower()
    report = cluster_report(up)
    placement = [(a["class"], a["ip"]) for a in report["actors"] if a["class"].startswith("ServeReplica:")]
    say(f"Serve replicas (class, node IP) as Ray reports them: {placement}")
    (replica,) = model_replicas(report)
    assert replica["ip"] == WORKER.ip
    assert [g["ip"] for g in gateway_replicas(report)] == [HEAD.ip]  # gateway.resources: the head's resource
    head, worker = _listening(HEAD), _listening(WORKER)
    say(f"direct port {DIRECT_PORT}: head {head.get(DIRECT_PORT)}, worker {worker.get(DIRECT_PORT)}")
    assert head[DIRECT_PORT] == {"0.0.0.0"} and DIRECT_PORT not in worker  # gateway.host, with auth on
    assert_proxies_bounded("`spillover deploy`")


def assert_proxies_bounded(deployed_by: str) -> None:
    """Every node's Serve proxy, and the gateway replicas' own listener on the head, serve with
    gateway.http_limits (the defaults here): a 32 MiB header is refused and a connection that sends nothing
    is closed (header_timeout_s, 10 s)."""
    huge = {port: attack.huge_header(HEAD.ip, port, within_s=60) for port in (8000, DIRECT_PORT)}
    silent = {host.name: attack.idle(host.ip, 8000, within_s=60) for host in (HEAD, WORKER)}
    silent["head direct"] = attack.idle(HEAD.ip, DIRECT_PORT, within_s=60)
    say(f"after {deployed_by}: 32 MiB header {huge}; silent connections {silent}")
    assert all(outcome.refused and outcome.status in (None, 431) for outcome in huge.values()), huge
    assert all(outcome.refused for outcome in silent.values()), silent


def gateway_replicas(report: dict) -> list[dict]:
    return [a for a in report["actors"] if a["class"].startswith("ServeReplica:") and "Gateway" in a["class"]]


def test_scaling_the_gateway_by_redeploying_keeps_the_engine_running(up: Launched) -> None:
    """README's scale step: change `gateway.replicas` and run the deploy again (here as an overlay,
    which `spillover deploy` merges on top of the config). Serve adds a gateway replica; the model's
    replica — its engine loaded — is left as it was."""
    before = cluster_report(up)
    (engine,) = model_replicas(before)
    assert len(gateway_replicas(before)) == 1
    overlay = up.hosts.state / "scale.yaml"
    # several gateway replicas share one store: the config names the head's Redis from its first deploy
    overlay.write_text("gateway:\n  replicas: 2\n")
    started = time.monotonic()
    up.on_head(f"spillover deploy --config {up.spillover_config} --overlay {overlay}", timeout=480)
    report = cluster_report(up)
    gateways = gateway_replicas(report)
    took = time.monotonic() - started
    say(f"redeploy with gateway.replicas 2 took {took:.0f}s; gateways on {[g['ip'] for g in gateways]}")
    assert [g["ip"] for g in gateways] == [HEAD.ip, HEAD.ip]  # both share the head's direct port
    assert model_replicas(report) == [engine]  # the same actor on the same node: not restarted
    answer = ask(up)
    assert "paris" in answer.lower()
    # both gateway replicas reach the head's Redis with the nodes' password: each pushes its
    # series there, so one scrape of the address shows both, each with the store up
    deadline = time.monotonic() + 60
    while (seen := store_up_by_replica(httpx.get(f"{GATEWAY}/metrics", timeout=10).text)) != {
        replica: 1.0 for replica in seen
    } or len(seen) != 2:
        assert time.monotonic() < deadline, f"spillover_state_store_up per gateway replica: {seen}"
        time.sleep(2)
    say(f"spillover_state_store_up per gateway replica, one scrape: {seen}")


def store_up_by_replica(text: str) -> dict[str, float]:
    """`spillover_state_store_up` of every gateway replica in one scrape (serve_apps/telemetry/replica_metrics.py)."""
    return {
        sample.labels.get("gateway_replica", ""): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "spillover_state_store_up"
    }


def test_rendered_serve_config_deployed_with_ray_serve_serves_the_same_app(up: Launched) -> None:
    # `serve shutdown` leaves the detached telemetry board holding the old replica's last reading for a
    # while: the new gateway must not read it as a model gone red, and /readyz waits for a fresh one
    up.on_head("serve shutdown -y", timeout=180)
    serve_yaml = up.hosts.state / "serve.yaml"
    started = time.monotonic()
    up.on_head(f"spillover render --config {up.spillover_config} --out {serve_yaml} && serve deploy {serve_yaml}")
    try:
        wait_ready(300)
    except AssertionError:
        say("`serve status` on the head:\n" + up.on_head("serve status", timeout=120, check=False)[-4000:])
        raise
    say(f"`serve deploy` of the rendered file ready after {time.monotonic() - started:.0f}s")
    answer = ask(up)
    say(f"chat through {DIRECT} (rendered app): {answer!r}")
    assert "paris" in answer.lower()
    (replica,) = model_replicas(cluster_report(up))
    assert replica["ip"] == WORKER.ip
    assert_proxies_bounded("`serve deploy` of the rendered file")


def test_serve_shutdown_ray_down_and_ray_stop_on_workers_leave_only_sshd(up: Launched) -> None:
    """README's stop sequence. `serve shutdown` first: vLLM's engine processes are children of a
    replica that `ray stop` does not know, and they outlived a `ray stop` of the worker without it.
    Ray's local provider stops Ray only on the head at `ray down`; a worker's raylet exits once the
    head is gone, but not all of Ray's processes there: hence `ray stop` on each worker. The head's Redis
    (the shared store) outlives `ray down` by design: its own `--stop` goes first."""
    up.on_head("serve shutdown -y", timeout=180)
    stopped = up.on_head(f"python -m serve_apps.state.local_redis {HEAD_REDIS} --stop", timeout=60)
    say(stopped.strip().splitlines()[-1] if stopped.strip() else "no output from --stop")
    up.ray("down", "-y", str(up.config), timeout=180)
    up.down = True
    started = time.monotonic()
    while left := up.hosts.processes(HEAD):
        assert time.monotonic() - started < 60, f"still running on the head after `ray down`: {left}"
        time.sleep(1)
    say(f"{HEAD.name}: nothing but its sshd {time.monotonic() - started:.0f}s after `ray down`")
    say(f"{WORKER.name} after `ray down`: {len(up.hosts.processes(WORKER))} processes still running")
    stop = subprocess.run(
        [*up.hosts.ssh_args(WORKER), f"{REPO}/.venv/bin/ray stop"], capture_output=True, text=True, timeout=120
    )
    assert stop.returncode == 0, stop.stderr
    started = time.monotonic()
    while left := up.hosts.processes(WORKER):
        assert time.monotonic() - started < 60, f"still running on {WORKER.name} after `ray stop`: {left}"
        time.sleep(1)
    say(f"{WORKER.name}: nothing but its sshd after `ray stop`")
