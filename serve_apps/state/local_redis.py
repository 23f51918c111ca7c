"""A loopback Redis server of spillover's own: what `spillover serve` starts when the config runs more than one
gateway replica and names no `state.url`, and what the store tests run against.

Bound to 127.0.0.1 (or the address given), a password required (written to a config file only its owner can
read, never on the command line where `ps` shows it), the append-only file on (`appendfsync everysec`: a
crash loses at most a second of spend), snapshots off, and past `maxmemory` the keys closest to expiry
evicted first (`volatile-ttl`): records and idempotent answers go, the spend ledger's sums (no TTL) never.

ray-cluster.yaml starts the head's one as a daemon, before Ray:

    python -m serve_apps.state.local_redis --host auto --port 6380 --folder ~/.spillover/state \
        --password-file ~/.spillover/state_password

`--host auto` is the address Ray gives the node; a server already answering there with that password is left
as it is (a second `ray up` keeps the data), and the command returns once the server answers. `ray down`
leaves it running; `--stop` (the same host, port and password file) shuts it down, its data kept on disk.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import redis

from router.errors import ClusterError

INSTALL_HINT = "install Debian's redis-server (>= 7): apt-get install redis-server"


def redis_server() -> str:
    found = shutil.which("redis-server")
    if found is None:
        raise ClusterError(f"no redis-server on PATH: {INSTALL_HINT}")
    return found


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


class LocalRedis:
    def __init__(
        self,
        folder: Path,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        password: str | None = None,
        maxmemory_mb: int = 512,
        daemonize: bool = False,
    ) -> None:
        self.folder = folder
        self.host = host
        self.port = port or free_port(host)
        self.password = password or secrets.token_urlsafe(24)
        self.maxmemory_mb = maxmemory_mb
        self.daemonize = daemonize  # outlives this process (ray-cluster.yaml's head); stop it with SHUTDOWN
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The address without the password (the password travels in its own variable)."""
        return f"redis://{self.host}:{self.port}/0"

    def _config(self) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / "redis.conf"
        lines = [
            f"bind {self.host}",
            f"port {self.port}",
            "protected-mode yes",
            f'requirepass "{self.password}"',
            f'dir "{self.folder}"',
            "appendonly yes",
            "appendfsync everysec",
            'save ""',
            f"maxmemory {self.maxmemory_mb}mb",
            "maxmemory-policy volatile-ttl",
            f'logfile "{self.folder / "redis.log"}"',
        ]
        if self.daemonize:
            lines += ["daemonize yes", f'pidfile "{self.folder / "redis.pid"}"']
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write("\n".join(lines) + "\n")
        return path

    def start(self, *, timeout_s: float = 10.0) -> LocalRedis:
        """Start it and wait until it answers; ClusterError when it does not within `timeout_s`."""
        config = self._config()
        self._process = subprocess.Popen([redis_server(), str(config)], stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        client = redis.Redis(host=self.host, port=self.port, password=self.password, socket_timeout=1.0)
        try:
            while True:
                try:
                    client.ping()
                    return self
                except redis.RedisError as exc:
                    exited = self._process.poll()
                    if (exited is not None and not (self.daemonize and exited == 0)) or time.monotonic() > deadline:
                        self.stop()
                        log = self.folder / "redis.log"
                        tail = log.read_text()[-1000:] if log.exists() else ""
                        where = f"{self.host}:{self.port}"
                        raise ClusterError(f"redis-server on {where} did not start: {exc}\n{tail}") from None
                    time.sleep(0.05)
        finally:
            client.close()

    def answers(self) -> bool:
        """Something at this address answers a ping with this password."""
        client = redis.Redis(host=self.host, port=self.port, password=self.password, socket_timeout=1.0)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def pause(self) -> None:
        """SIGSTOP: it holds its connections and answers nothing (a hung server)."""
        if self._process is not None:
            self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self._process is not None:
            self._process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """Stop it (SIGTERM: it writes its append-only file and exits), waiting up to 10 s."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGCONT)
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def node_address() -> str:
    """The address Ray gives this node (what the other nodes reach it at)."""
    from ray.util import get_node_ip_address

    address: str = get_node_ip_address()
    return address


def shutdown(host: str, port: int, password: str) -> int:
    """SHUTDOWN the server at host:port (it writes its append-only file first); 0 also when none answers."""
    client = redis.Redis(host=host, port=port, password=password, socket_timeout=10.0)
    try:
        client.ping()
    except redis.ConnectionError:
        print(f"local_redis: nothing answers on {host}:{port}")
        return 0
    except redis.RedisError as exc:
        print(f"local_redis: {host}:{port} refused: {exc}")
        return 1
    try:
        client.shutdown()
    except redis.RedisError as exc:
        print(f"local_redis: {host}:{port} did not shut down: {exc}")
        return 1
    finally:
        client.close()
    print(f"local_redis: redis-server on {host}:{port} shut down")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serve_apps.state.local_redis", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind; auto: the node's Ray address")
    parser.add_argument("--port", type=int, default=6380)
    parser.add_argument("--folder", type=Path, help="its data (the append-only file) and log; needed to start")
    parser.add_argument("--password-file", type=Path, required=True, help="a file holding the password")
    parser.add_argument("--maxmemory-mb", type=int, default=512)
    parser.add_argument("--stop", action="store_true", help="shut down the server answering there (data kept)")
    args = parser.parse_args(argv)
    if not args.stop and args.folder is None:
        parser.error("--folder is required to start a server")
    try:
        password = args.password_file.expanduser().read_text().strip()
    except OSError as exc:
        print(f"local_redis: cannot read the password file {args.password_file}: {exc.strerror}")
        return 2
    if len(password) < 16:
        print(f"local_redis: the password in {args.password_file} is shorter than 16 characters")
        return 2
    host = node_address() if args.host == "auto" else args.host
    if args.stop:
        return shutdown(host, args.port, password)
    server = LocalRedis(
        args.folder.expanduser(),
        host=host,
        port=args.port,
        password=password,
        maxmemory_mb=args.maxmemory_mb,
        daemonize=True,
    )
    if server.answers():
        print(f"local_redis: already answering on {host}:{args.port}")
        return 0
    try:
        server.start()
    except ClusterError as exc:
        print(f"local_redis: {exc.message}")
        return 1
    print(f"local_redis: redis-server on {host}:{args.port}, data in {server.folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
