"""Start Ray (when needed), deploy the application, wait until it answers, shut down.

Used by `spillover serve` and by the integration tests (one deployment per test session).

With `state.url: local` it also starts the gateway replicas' shared store: a loopback redis-server of its own
(serve_apps/state/local_redis.py) whose data (the append-only file) lives beside the model cache, so the spend
it keeps survives a restart; its address replaces `local` in the deployed config and its password reaches the
replicas in the variable `state.password_env` names, through the job's environment (never in the config).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import httpx
import ray
from ray import serve
from ray.serve.context import _get_global_client as serve_client
from ray.serve.schema import ServeDeploySchema

from cluster.config.deployment import SpilloverConfig
from cluster.config.gateway import LOCAL
from cluster.hardware.nvml import FAKE_NVML_ENV
from cluster.hardware.nvml_sim import prepare_simulated_gpus
from cluster.models import CATALOG, cache_dir, prepare
from cluster.render import APP_NAME, application, http_options
from router.errors import ClusterError
from serve_apps.app import build_app, check_deployable
from serve_apps.http.limits import proxy_env
from serve_apps.resilience.breaker_exchange import kill_exchange
from serve_apps.sessions.actor import kill_pins
from serve_apps.state.local_redis import LocalRedis
from serve_apps.telemetry.board import kill_board
from serve_apps.traffic.board import kill_traffic_board

Say = Callable[[str], None]
PROXY_READY_ENV = "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"
PROXY_READY_S = "30"
AUTH_MODE_ENV = "RAY_AUTH_MODE"
RAY_ADDRESS_ENV = "RAY_ADDRESS"
# Task events Ray's GCS keeps for its dashboard and `ray list tasks`: every actor call (each request through
# Serve, each stats push) leaves ~3.4 KiB there, up to Ray's default of 100,000 (~340 MiB); a 30-minute
# soak saw gcs_server grow 55 -> 132 MiB. 2,000 bounds it near 7 MiB and still shows the recent calls.
TASK_EVENTS_IN_GCS = 2000


@dataclass
class Running:
    base_url: str
    started_ray: bool
    store: LocalRedis | None = None  # the loopback shared store started for `state.url: local`

    def stop(self) -> None:
        try:
            serve.shutdown()
            kill_board()
            kill_exchange()
            kill_traffic_board()
            kill_pins()
        finally:
            if self.started_ray:
                ray.shutdown()
            if self.store is not None:
                self.store.stop()


def local_store(config: SpilloverConfig, say: Say) -> tuple[SpilloverConfig, LocalRedis | None, dict[str, str]]:
    """For `state.url: local`: start the loopback Redis; the config with its address, it, and the job's
    variables that carry its password. Any other config comes back as it is."""
    state = config.state
    if state.url != LOCAL:
        return config, None, {}
    if config.cluster.address:
        raise ClusterError(
            "state.url 'local' starts a loopback Redis that only this machine reaches: with cluster.address "
            "(a cluster of several machines) set state.url to the head's Redis (redis://HEAD:6380/0)"
        )
    folder = cache_dir().parent / "state-redis"
    store = LocalRedis(folder).start()
    say(f"shared store: redis-server on {store.host}:{store.port} (data in {folder})")
    config = config.model_copy(update={"state": state.model_copy(update={"url": store.url})})
    return config, store, {state.password_env: store.password}


def prepare_models(config: SpilloverConfig, say: Say) -> None:
    """Build every `prepared:` model the config names that is not built yet."""
    for spec in config.models:
        if spec.is_prepared_source and spec.prepared_name in CATALOG:
            prepare(spec.prepared_name, progress=lambda step, total, text: say(f"  model [{step}/{total}] {text}"))


def connect_ray(config: SpilloverConfig, say: Say, extra_env: dict[str, str] | None = None) -> bool:
    """Connect to the configured/running Ray, else start a local one. True if started here.

    The job's environment carries `gateway.http_limits` to the Serve proxies it starts (they inherit
    the controller's, which inherits the job's). A local Ray listens on this machine's addresses (Ray
    2.60 takes the routable one as the node's even when told loopback): Ray's token authentication,
    on by default for a new local cluster, is what guards its ports; with it turned off
    (RAY_AUTH_MODE=disabled) this says so.

    Without `cluster.address` the Ray is always a new local one (`ray.init(address="local")`): a bare
    `ray.init()` attaches to whatever cluster `RAY_ADDRESS` or the file `ray start` and Ray's test clusters
    leave behind (/tmp/ray/ray_current_cluster) name, even one long gone, and then refuses the CPU count
    (measured: a file left by a killed test cluster failed every later local start)."""
    if ray.is_initialized():
        return False
    address = config.cluster.address
    env = {
        "env_vars": {
            "RAY_DEDUP_LOGS": "1",
            **proxy_env(config.gateway.http_limits),
            **serve_controller_env(os.environ),
            **(extra_env or {}),
        }
    }
    if address:
        say(f"connecting to Ray at {address}")
        _probe(address)
        try:
            ray.init(address=address, runtime_env=env, log_to_driver=False)
        except ConnectionError as exc:
            raise ClusterError(f"no Ray cluster reachable at {address!r}: {exc}") from None
        return False
    gpus = f", {config.cluster.num_gpus} GPUs" if config.cluster.num_gpus is not None else ""
    say(f"starting a local Ray ({config.cluster.num_cpus or 'all'} logical CPUs{gpus})")
    if os.environ.get(RAY_ADDRESS_ENV):
        say(f"  {RAY_ADDRESS_ENV}={os.environ[RAY_ADDRESS_ENV]} is not used: set cluster.address to join that cluster")
    if any(m.accelerator == "gpu-sim" for m in config.models):
        file, written = prepare_simulated_gpus(os.environ, config.cluster.num_gpus or 1)
        say(f"simulated GPUs: {FAKE_NVML_ENV}={file}" + (" (written: idle devices)" if written else ""))
        say("  edit that file (replace it atomically) to make another process take GPU memory")
    ray.init(
        address="local",
        num_cpus=config.cluster.num_cpus,
        num_gpus=config.cluster.num_gpus,
        runtime_env=env,
        log_to_driver=False,
        include_dashboard=False,
        _system_config={"task_events_max_num_task_in_gcs": TASK_EVENTS_IN_GCS},
    )
    if os.environ.get(AUTH_MODE_ENV, "token").lower() != "token":  # Ray 2.60 sets "token" for a new cluster
        say(f"  warning: {AUTH_MODE_ENV}={os.environ[AUTH_MODE_ENV]}: Ray's ports take anyone who reaches this machine")
    return True


def serve_controller_env(environ: Mapping[str, str]) -> dict[str, str]:
    """Settings for the Serve controller this job starts (it inherits the job's environment): how long a new
    HTTP proxy may take to say it is ready before the controller kills and restarts it. Ray's 5 s is less than a
    proxy's worker takes to start and import Serve on a busy 2-core node (measured: every proxy killed before it
    ran while the node was loaded, and `serve.start`, waiting on the first one, failed). The operator's own
    setting wins."""
    return {PROXY_READY_ENV: environ.get(PROXY_READY_ENV, PROXY_READY_S)}


def start_serve(config: SpilloverConfig, say: Say) -> None:
    """`serve.start`, surviving a proxy that the controller replaced while it started: Ray's `serve.start`
    waits on the first proxy it asked for and raises when that one dies or is late, but the controller is up
    and keeps starting proxies (the readiness wait after the deploy covers them); a second `serve.start`
    joins that controller."""
    try:
        serve.start(proxy_location="EveryNode", http_options=http_options(config))
        return
    except (ray.exceptions.ActorDiedError, TimeoutError) as exc:
        say(f"  Serve's HTTP proxy was replaced while starting ({type(exc).__name__}); its controller starts another")
    try:
        serve.start(proxy_location="EveryNode", http_options=http_options(config))
    except (ray.exceptions.RayError, TimeoutError) as exc:
        raise ClusterError(f"Serve did not start: {exc}") from None


def _probe(address: str, timeout_s: float = 3.0) -> None:
    """Fail fast on an unreachable `host:port` (ray.init would retry for minutes)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return  # "auto" and other forms: ray.init answers quickly itself
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ClusterError(f"no Ray cluster reachable at {address!r}: {exc.strerror or exc}") from None


def deploy(config: SpilloverConfig, config_path: str, say: Say, *, poll_s: float = 2.0) -> Running:
    """Deploy and block until `/readyz` answers 200; raise ClusterError on failure/timeout."""
    check_deployable(config, config_path)  # config errors surface before Ray starts
    prepare_models(config, say)
    config, store, store_env = local_store(config, say)
    try:
        started = connect_ray(config, say, store_env)
    except BaseException:
        if store is not None:
            store.stop()
        raise
    build_app(config, config_path)  # config errors surface here; after ray.init: building may auto-init a Ray
    host, port = config.gateway.host, config.gateway.port
    start_serve(config, say)
    # Applied as `serve deploy` applies a config file (cluster/render.py): a redeploy that changes only
    # the gateway's replica count resizes that deployment and leaves the engines running; `serve.run`
    # would give every deployment a new random version and restart every replica.
    target = ServeDeploySchema.model_validate({"applications": [application(config, config_path)]})
    client = serve_client()
    if client is None:
        raise ClusterError("Serve's controller is not reachable after serve.start")
    try:
        client.deploy_apps(target)
    except ray.exceptions.RayError as exc:
        raise ClusterError(f"deployment failed: {exc}") from None
    url_host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    running = Running(base_url=f"http://{url_host}:{port}", started_ray=started, store=store)
    try:
        _wait_ready(running.base_url, config.gateway.readiness_timeout_s, say, poll_s)
    except BaseException:
        running.stop()
        raise
    return running


def _deployment_summary() -> tuple[str, str]:
    """The application's status (RUNNING, DEPLOYING, ...) and its deployments' for the progress line."""
    try:
        app = serve.status().applications.get(APP_NAME)
    except Exception:  # noqa: BLE001 - status is only decoration for the progress line
        return "", ""
    if app is None:
        return "", "waiting for the controller"
    parts = [f"{name.split(':')[-1]}={d.status.value.lower()}" for name, d in app.deployments.items()]
    if app.status.value == "DEPLOY_FAILED":
        raise ClusterError(f"deployment failed: {app.message.strip()[-2000:]}")
    return app.status.value, ", ".join(parts) or app.status.value.lower()


def _wait_ready(base_url: str, timeout_s: float, say: Say, poll_s: float) -> None:
    started = time.monotonic()
    last = ""
    while True:
        elapsed = time.monotonic() - started
        if elapsed > timeout_s:
            raise ClusterError(f"not ready after {timeout_s:.0f}s ({last})")
        status, summary = _deployment_summary()
        if status == "RUNNING":
            try:
                response = httpx.get(f"{base_url}/readyz", timeout=10)
                if response.status_code == 200:
                    say(f"ready after {elapsed:.0f}s")
                    _say_engines(base_url, say)
                    return
                summary = f"readyz {response.status_code}: {response.text[:200]}"
            except httpx.HTTPError as exc:
                summary = f"gateway not answering yet ({type(exc).__name__})"
        if summary != last:
            say(f"  [{elapsed:4.0f}s] {summary}")
            last = summary
        time.sleep(poll_s)


def _say_engines(base_url: str, say: Say) -> None:
    """Each local replica's engine as it chose to run: precision and why, threads, numerics."""
    try:
        replicas = httpx.get(f"{base_url}/v1/spillover/cluster", timeout=10).json().get("replicas", [])
    except (httpx.HTTPError, ValueError):
        return  # an operator route behind auth: `spillover status` shows the same
    for replica in replicas:
        if not replica.get("precision"):
            continue
        say(f"  {replica['model']}: {replica['precision']}, numerics {replica.get('numerics')}")
        for note in replica.get("notes") or ():
            say(f"    {note}")
