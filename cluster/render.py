"""`spillover render`: the Serve config file equivalent to `spillover deploy`.

The whole validated spillover config is embedded in the application's `args`, so `serve deploy`
needs no file but the one written here: the app builder (`serve_apps.app:app_builder`) takes
either `config` (a path on the head node) or `config_data` (the embedded mapping).
"""

from __future__ import annotations

from typing import Any

from cluster.config import SpilloverConfig, dump_config

APP_NAME = "spillover"
IMPORT_PATH = "serve_apps.app:app_builder"


def serve_config(config: SpilloverConfig, source: str) -> dict[str, Any]:
    return {
        "proxy_location": "EveryNode",
        "http_options": {"host": config.gateway.host, "port": config.gateway.port},
        "applications": [
            {
                "name": APP_NAME,
                "route_prefix": "/",
                "import_path": IMPORT_PATH,
                "args": {"config_data": dump_config(config), "config_source": source},
            }
        ],
    }
