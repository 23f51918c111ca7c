"""Test hosts for `ray up`: each host is a Linux network namespace with its own sshd.

A host here is what Ray's local node provider needs from a machine: an address it can SSH to
with a key, a shell that sources ~/.bashrc, and its own view of the things that are per-machine.

* network: a namespace with one veth on a private bridge this module owns (`BRIDGE`, SUBNET.0/24,
  the bridge itself is SUBNET.1 so the launching machine can reach the hosts). No default route:
  a host can reach the other hosts and nothing else. Its hostname resolves to its own address
  (`/etc/netns/<ns>/hosts`, which `ip netns exec` binds over /etc/hosts): Ray finds a node's IP
  that way when no route to the internet exists.
* processes: its own PID namespace, whose PID 1 is the host's sshd. `ray stop` on one host then
  sees only that host's processes (it finds Ray processes by scanning /proc), and killing
  the namespace's PID 1 takes everything started on the host with it.
* files: the machine's filesystem (so every host sees the same checkout and .venv), except a
  private /tmp (Ray's session and socket files, the local provider's state file, SSH control
  sockets) and a private home (~/ray_bootstrap_config.yaml and the key `ray up` copies to the
  head). The prepared-model cache is bound into each home at the same path.
* a profile: the `~/.bashrc` each host starts with (Ray sources it before every command), where
  the test puts what a real machine's environment would hold (its CPU count, the tenant key).

Everything is torn down by `TestHosts.stop()` — every process in each namespace killed, the
namespaces, the bridge and the state directory removed — and leftovers of an earlier run that
was killed outright are removed before a new one starts.

    .venv/bin/python -m tests.cluster_launch.testhosts down     # remove leftovers by hand

Needs root, `ip`, `unshare`, and openssh-server + rsync (installed with apt-get when missing).
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SUBNET = "10.213.7"
BRIDGE = "splbr7"
NS_PREFIX = "spl-launch-"
SSHD = "/usr/sbin/sshd"
APT_PACKAGES = ("openssh-server", "openssh-client", "rsync", "iproute2", "util-linux")
NEEDED = {SSHD: "openssh-server", "ssh": "openssh-client", "ssh-keygen": "openssh-client", "rsync": "rsync"}
NEEDED |= {"ip": "iproute2", "unshare": "util-linux"}

# a host's PID 1 (its sshd) gets its own hostname, PID and mount namespaces; it dies with its launcher
UNSHARE_HOST = ["--uts", "--pid", "--kill-child", "--mount-proc", "--propagation", "private"]
SSH_OPTIONS = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes"]
SSH_OPTIONS += ["-o", "LogLevel=ERROR", "-o", "ConnectTimeout=5"]

Say = Callable[[str], None]


class HostsError(RuntimeError):
    """The test hosts could not be created (no root, no namespaces, no sshd)."""


@dataclass(frozen=True)
class Host:
    name: str  # also its hostname
    ip: str
    cpus: int  # the CPU count Ray sees on this host (RAY_OVERRIDE_RESOURCES in its profile)

    @property
    def netns(self) -> str:
        return NS_PREFIX + self.name


def run(args: list[str], *, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise HostsError(f"{shlex.join(args)} failed ({done.returncode}): {(done.stderr or done.stdout).strip()}")
    return done


def missing_tools() -> list[str]:
    return sorted({pkg for tool, pkg in NEEDED.items() if not shutil.which(tool) and not Path(tool).exists()})


def ensure_tools(say: Say) -> None:
    """Install openssh-server and rsync (and the other tools) with apt-get when missing.

    Installing openssh-server must not start the machine's own sshd service: a policy-rc.d that
    refuses every service start is in place while apt runs (unless the machine has one already).
    """
    packages = missing_tools()
    if not packages:
        return
    if not shutil.which("apt-get"):
        raise HostsError(f"missing {', '.join(packages)} and no apt-get to install them")
    say(f"installing {' '.join(packages)} with apt-get (the launch test's SSH hosts need them)")
    policy = Path("/usr/sbin/policy-rc.d")
    guard = not policy.exists()
    if guard:
        policy.write_text(
            "#!/bin/sh\n# written by tests/cluster_launch while apt-get runs: start no services\nexit 101\n"
        )
        policy.chmod(0o755)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        for args in (
            ["apt-get", "update", "-q"],
            ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages],
        ):
            done = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env)
            if done.returncode != 0:
                raise HostsError(f"{shlex.join(args)} failed: {(done.stderr or done.stdout)[-2000:]}")
    finally:
        if guard:
            policy.unlink(missing_ok=True)
    if missing_tools():
        raise HostsError(f"still missing after apt-get: {', '.join(missing_tools())}")


def _pids(netns: str) -> list[int]:
    done = run(["ip", "netns", "pids", netns], check=False)
    return [int(p) for p in done.stdout.split()]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _kill_namespace(netns: str, timeout_s: float = 20) -> None:
    """SIGKILL every process in the namespace until none is left."""
    deadline = time.monotonic() + timeout_s
    while pids := _pids(netns):
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise HostsError(f"processes of {netns} survive SIGKILL: {pids}")
        time.sleep(0.2)


def remove_leftovers(say: Say = lambda _: None) -> None:
    """Remove this module's namespaces and bridge, wherever they came from (idempotent)."""
    listed = run(["ip", "netns", "list"], check=False).stdout.split("\n")
    for netns in sorted({line.split()[0] for line in listed if line.startswith(NS_PREFIX)}):
        say(f"removing {netns}")
        _kill_namespace(netns)
        run(["ip", "netns", "delete", netns], check=False)
        shutil.rmtree(f"/etc/netns/{netns}", ignore_errors=True)
    if run(["ip", "link", "show", BRIDGE], check=False).returncode == 0:
        run(["ip", "link", "delete", BRIDGE])


class TestHosts:
    """The hosts, their bridge, keys and sshd processes. `start()`, then `stop()` (always)."""

    __test__ = False  # not a pytest test class

    def __init__(self, hosts: list[Host], say: Say) -> None:
        self.hosts = hosts
        self._say = say
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self.state = Path(tempfile.mkdtemp(prefix="spillover-launch-", dir="/var/tmp"))  # not under /tmp: hosts hide it
        self.key = self.state / "id_ed25519"
        self.user = "root"
        self._made_run_sshd = False

    def home(self, host: Host) -> Path:
        return self.state / host.name / "home"

    def start(self, profile: dict[str, dict[str, str]], shared_dirs: list[Path]) -> None:
        """Create the bridge and the hosts and start their sshd. `profile[name]`: the variables each
        host's ~/.bashrc exports; `shared_dirs`: machine directories every host sees at the same path
        even where its private home or /tmp would hide them (the model cache, the interpreter)."""
        if os.geteuid() != 0:
            raise HostsError("the test hosts need root (network namespaces, mounts, sshd)")
        remove_leftovers(self._say)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "spillover-launch-test", "-f", str(self.key)])
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.state / "ssh_host_ed25519_key")])
        shutil.copy(f"{self.key}.pub", self.state / "authorized_keys")
        if not Path("/run/sshd").is_dir():  # sshd's privilege-separation directory
            os.makedirs("/run/sshd", mode=0o755)
            self._made_run_sshd = True
        run(["ip", "link", "add", BRIDGE, "type", "bridge"])
        run(["ip", "addr", "add", f"{SUBNET}.1/24", "dev", BRIDGE])
        run(["ip", "link", "set", BRIDGE, "up"])
        for index, host in enumerate(self.hosts):
            self._start_host(index, host, profile.get(host.name, {}), shared_dirs)
        for host in self.hosts:
            self._wait_for_ssh(host)

    def _start_host(self, index: int, host: Host, env: dict[str, str], shared_dirs: list[Path]) -> None:
        root = self.state / host.name
        (root / "tmp").mkdir(parents=True)
        (root / "tmp").chmod(0o1777)
        self.home(host).mkdir(mode=0o700)
        exports = {"RAY_OVERRIDE_RESOURCES": f'{{"CPU": {host.cpus}}}', **env}
        lines = [f"export {k}={shlex.quote(v)}" for k, v in exports.items()]
        (self.home(host) / ".bashrc").write_text("# this test host's profile\n" + "\n".join(lines) + "\n")
        netns, veth = host.netns, f"splv7h{index}"
        Path(f"/etc/netns/{netns}").mkdir(parents=True, exist_ok=True)
        Path(f"/etc/netns/{netns}/hosts").write_text(f"127.0.0.1 localhost\n{host.ip} {host.name}\n")
        run(["ip", "netns", "add", netns])
        run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns])
        run(["ip", "link", "set", veth, "master", BRIDGE])
        run(["ip", "link", "set", veth, "up"])
        run(["ip", "-n", netns, "addr", "add", f"{host.ip}/24", "dev", "eth0"])
        run(["ip", "-n", netns, "link", "set", "eth0", "up"])
        run(["ip", "-n", netns, "link", "set", "lo", "up"])
        config = root / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    f"ListenAddress {host.ip}:22",
                    f"HostKey {self.state / 'ssh_host_ed25519_key'}",
                    f"AuthorizedKeysFile {self.state / 'authorized_keys'}",
                    "PermitRootLogin prohibit-password",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",  # the key files live under /var/tmp (world-writable)
                    "PidFile none",
                    "MaxSessions 64",  # Ray multiplexes its commands over one connection
                    "Subsystem sftp internal-sftp",
                ]
            )
            + "\n"
        )
        hidden = (Path("/tmp"), Path(os.path.expanduser("~" + self.user)))
        before, after = [], []
        hidden_dirs = [d for d in shared_dirs if d.is_dir() and any(d.is_relative_to(h) for h in hidden)]
        for i, shared in enumerate(hidden_dirs):
            keep, path = root / f"shared{i}", shlex.quote(str(shared))
            keep.mkdir()
            before.append(f"mount --bind {path} {keep}")  # set aside before /tmp and the home are replaced
            after.append(f"mkdir -p {path} && mount --bind {keep} {path}")  # then back at its own path
        script = " && ".join(
            [
                f"hostname {host.name}",
                *before,
                f"mount --bind {root / 'tmp'} /tmp",
                f"mount --bind {self.home(host)} {shlex.quote(os.path.expanduser('~' + self.user))}",
                *after,
                f"exec {SSHD} -D -e -f {config}",
            ]
        )
        log = open(root / "sshd.log", "wb")
        self._procs[host.name] = subprocess.Popen(
            ["ip", "netns", "exec", netns, "unshare", *UNSHARE_HOST, "sh", "-c", script],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def ssh_args(self, host: Host) -> list[str]:
        return ["ssh", "-i", str(self.key), *SSH_OPTIONS, f"{self.user}@{host.ip}"]

    def _wait_for_ssh(self, host: Host, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            done = subprocess.run([*self.ssh_args(host), "hostname"], capture_output=True, text=True, timeout=30)
            if done.returncode == 0 and done.stdout.strip() == host.name:
                return
            proc = self._procs[host.name]
            if proc.poll() is not None or time.monotonic() > deadline:
                log = (self.state / host.name / "sshd.log").read_text(errors="replace")[-2000:]
                raise HostsError(f"sshd on {host.name} ({host.ip}) not reachable: {done.stderr.strip()}; log: {log}")
            time.sleep(0.3)

    def processes(self, host: Host) -> list[str]:
        """Command lines of what runs on `host` besides its sshd and the namespace's own launcher."""
        found = [_cmdline(pid) for pid in _pids(host.netns)]
        return [c for c in found if c and not c.startswith(("sshd", SSHD, "unshare", "ip netns exec"))]

    def stop(self) -> None:
        """Kill everything on every host, remove the namespaces, bridge and state (idempotent)."""
        errors: list[str] = []
        for host in self.hosts:
            try:
                _kill_namespace(host.netns)
            except HostsError as exc:
                errors.append(str(exc))
            run(["ip", "netns", "delete", host.netns], check=False)
            shutil.rmtree(f"/etc/netns/{host.netns}", ignore_errors=True)
        for proc in self._procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                errors.append(f"launcher {proc.pid} did not exit")
        if run(["ip", "link", "show", BRIDGE], check=False).returncode == 0:
            run(["ip", "link", "delete", BRIDGE], check=False)
        shutil.rmtree(self.state, ignore_errors=True)
        if self._made_run_sshd:
            try:
                os.rmdir("/run/sshd")
            except OSError:
                pass
        if errors:
            raise HostsError("; ".join(errors))

    def leftovers(self) -> list[str]:
        """What of this run is still there (empty after a clean `stop()`)."""
        found = [f"netns {line.split()[0]}" for line in run(["ip", "netns", "list"]).stdout.splitlines()]
        found = [f for f in found if f.startswith(f"netns {NS_PREFIX}")]
        if run(["ip", "link", "show", BRIDGE], check=False).returncode == 0:
            found.append(f"bridge {BRIDGE}")
        found += [f"process {p.pid}" for p in self._procs.values() if p.poll() is None]
        if self.state.exists():
            found.append(f"dir {self.state}")
        return found


if __name__ == "__main__":
    if sys.argv[1:] != ["down"]:
        sys.exit("usage: python -m tests.cluster_launch.testhosts down   (removes leftover test hosts)")
    remove_leftovers(print)
