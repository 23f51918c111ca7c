"""A cloud simulator: a real OpenAI-compatible HTTP server with configurable latency,
capacity and injectable faults, used as the burst target in tests and benchmarks.

    settings.py     SimSettings: models, timing, capacity, fault rates, API key
    faults.py       which fault one request gets (one seeded draw per request)
    replies.py      deterministic replies in the OpenAI JSON and SSE shapes
    request_log.py  one JSON line per /v1 request received
    server.py       build_app(settings, *, rng, clock, sleep, log_path) -> Starlette
    cli.py          add_cloud_sim_parser / run_cloud_sim (uvicorn)
"""

from bench.cloud_sim.cli import add_cloud_sim_arguments, add_cloud_sim_parser, run_cloud_sim
from bench.cloud_sim.faults import Fault, decide_fault
from bench.cloud_sim.server import build_app
from bench.cloud_sim.settings import InvalidSettings, SimSettings

__all__ = [
    "Fault",
    "InvalidSettings",
    "SimSettings",
    "add_cloud_sim_arguments",
    "add_cloud_sim_parser",
    "build_app",
    "decide_fault",
    "run_cloud_sim",
]
