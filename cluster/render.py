"""The Serve config of the application: what `spillover render` writes and `spillover deploy` applies.

The whole validated spillover config is embedded in the application's `args`, so `serve deploy`
needs no file but the one written here: the app builder (`serve_apps.app:app_builder`) takes
either `config` (a path on the head node) or `config_data` (the embedded mapping).

Serve restarts every replica of an application whose `import_path`, `runtime_env` or `args`
change (it hashes them into the application's code version), and only resizes a deployment whose
`deployments:` entry changes. So what an operator changes to scale lives in `deployments:`, not in
`args`: the gateway's replica count (`gateway.replicas`) is applied there and embedded as 1, and a
redeploy that only changes it adds or removes gateway replicas while the engines keep running.
`args.code` fingerprints the deployed packages' source, so a redeploy after a code upgrade rolls
every replica onto the new code.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from cluster.config.deployment import SpilloverConfig, dump_config

APP_NAME = "spillover"
IMPORT_PATH = "serve_apps.app:app_builder"
GATEWAY_DEPLOYMENT = "SpilloverGateway"
DEPLOYED_PACKAGES = ("router", "cluster", "serve_apps")


def code_fingerprint(root: Path | None = None) -> str:
    """A hash of the source files of the packages the replicas run (paths and contents)."""
    root = root or Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for package in DEPLOYED_PACKAGES:
        for file in sorted((root / package).rglob("*.py")):
            digest.update(file.relative_to(root).as_posix().encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def application(config: SpilloverConfig, source: str, code: str | None = None) -> dict[str, Any]:
    """The Serve application entry for `config` (scale settings in `deployments`, see above)."""
    embedded = dump_config(config)
    deployments: list[dict[str, Any]] = []
    if config.gateway.autoscaling is None:
        embedded["gateway"]["replicas"] = 1
        deployments.append({"name": GATEWAY_DEPLOYMENT, "num_replicas": config.gateway.replicas})
    return {
        "name": APP_NAME,
        "route_prefix": "/",
        "import_path": IMPORT_PATH,
        "args": {"config_data": embedded, "config_source": source, "code": code or code_fingerprint()},
        "deployments": deployments,
    }


def http_options(config: SpilloverConfig) -> dict[str, Any]:
    """Serve's proxy options: where it listens, and `gateway.http_limits.idle_timeout_s` as its keep-alive
    (the other limits reach the proxy through its environment: serve_apps/http/limits.py)."""
    gateway = config.gateway
    return {"host": gateway.host, "port": gateway.port, "keep_alive_timeout_s": gateway.http_limits.idle_timeout_s}


def serve_config(config: SpilloverConfig, source: str, code: str | None = None) -> dict[str, Any]:
    return {
        "proxy_location": "EveryNode",
        "http_options": http_options(config),
        "applications": [application(config, source, code)],
    }
