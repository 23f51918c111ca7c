"""`spillover status`: the live cluster as the gateway sees it.

Reads `GET /v1/spillover/cluster` from the gateway (the snapshot the router uses, with the
saturation and GPU pressure it computed for each replica: the same numbers the router decides with
and `/metrics` exports) and this node's GPUs through NVML, and prints nodes, GPUs, replicas with KV
usage, running/waiting, prefix-cache hit rate, KV budget from the engine's blocks, saturation and
the age of each reading.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import time
from typing import Any

from cluster.config.deployment import load_config
from cluster.hardware.nvml import reader_from_env
from router.routing.snapshot import ReplicaStats
from spillover.gateway_client import add_key_argument, gateway_url, get_json

GIB = 1024**3


REPLICA_FIELDS = {f.name for f in dataclasses.fields(ReplicaStats)}


def _number(value: float | None) -> float:
    """The gateway writes an infinite saturation or pressure as null (JSON has no infinity)."""
    return math.inf if value is None else float(value)


def add_status_parser(subparsers: Any) -> None:
    status = subparsers.add_parser("status", help="show the live cluster: replicas, KV usage, saturation")
    status.add_argument("--config", default=None, help="config whose gateway to ask")
    status.add_argument("--url", default=None, help="gateway base URL (default: from the config)")
    status.add_argument("--json", action="store_true")
    add_key_argument(status)
    status.set_defaults(func=cmd_status)


def cmd_status(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    url = gateway_url(config, args.url)
    gpus = reader_from_env(os.environ).read()
    if not args.json:
        print(f"this node: {len(gpus.gpus)} GPU(s)" if gpus.ok else f"this node: no GPUs ({gpus.reason})")
    data = get_json(url, "/v1/spillover/cluster", args.api_key_env)
    now = time.time()
    rows = []
    for shown in data["replicas"]:
        stats = ReplicaStats.from_dict({k: v for k, v in shown.items() if k in REPLICA_FIELDS and k != "gpus"})
        for gpu_row in shown["gpus"]:
            gpu_row["pressure"] = _number(gpu_row["pressure"])
        rows.append(
            {
                **{k: v for k, v in shown.items() if k not in ("stale", "saturation")},
                "age_s": round(stats.age(now), 2),
                "saturation": _number(shown["saturation"]),
                "kv_budget_tokens": stats.kv_budget_tokens,
                "prefix_cache_hit_rate": stats.prefix_cache_hit_rate,
            }
        )
    if args.json:
        print(
            json.dumps(
                {
                    "gateway": url,
                    "local_gpus": gpus.to_dict(),
                    "models": data["models"],
                    "replicas": rows,
                    "golden": data.get("golden", {}),
                    "errors": data["errors"],
                },
                indent=2,
                default=str,
            )
        )
        return 0
    print(f"gateway {url}   snapshot age {max(0.0, now - data['taken_at']):.2f}s   models: {', '.join(data['models'])}")
    nodes = sorted({r["node_id"] for r in rows})
    print(f"nodes with replicas: {len(nodes)}  " + "  ".join(n[:12] for n in nodes))
    if gpus.ok:
        for g in gpus.gpus:
            print(
                f"  GPU {g.index} {g.name}: {g.memory_used / 2**30:.1f}/{g.memory_total / 2**30:.1f} GiB used, "
                f"util {g.utilization_gpu}%"
            )
    else:
        print(f"this node: no GPUs ({gpus.reason})")
    header = (
        f"{'model':<24} {'replica':<10} {'kv':>6} {'run':>4} {'wait':>4} {'hit%':>5} {'kv tokens':>10} "
        f"{'saturation':>10}  {'binding':<28} {'age':>6}"
    )
    print(header)
    for r in rows:
        sat = "stale" if r["saturation_term"] == "stale" else f"{r['saturation']:.2f}"
        budget = r["kv_budget_tokens"] if r["kv_budget_tokens"] is not None else "-"
        print(
            f"{r['model'][:24]:<24} {r['replica_id'][:10]:<10} {r['kv_cache_usage']:>6.1%} {r['num_running']:>4} "
            f"{r['num_waiting']:>4} {r['prefix_cache_hit_rate']:>5.0%} {budget:>10} {sat:>10}  "
            f"{r['saturation_detail'][:28]:<28} {r['age_s']:>5.2f}s"
        )
    for r in rows:
        for g in r["gpus"]:
            util = "-" if g["utilization_gpu"] is None else f"{g['utilization_gpu']}%"
            used, total = g["used_bytes"] / GIB, g["total_bytes"] / GIB
            print(
                f"  {r['replica_id'][:10]} gpu{g['index']}: {used:.1f}/{total:.1f} GiB used = "
                f"engine {g['engine_bytes'] / GIB:.1f} (by {g['attribution']}) + others {g['other_bytes'] / GIB:.1f}; "
                f"SM {util}; pressure {g['pressure']:.2f}"
            )
        if r.get("gpu_error"):
            print(f"  {r['replica_id'][:10]} GPUs unreadable: {r['gpu_error']}")
        if r.get("precision"):  # what the replica chose for its engine, and why (serve_apps/engine/startup.py)
            cpu = f" on {r['cpu_class']}" if r.get("cpu_class") else ""
            print(f"  {r['replica_id'][:10]} engine {r['precision']}{cpu}; numerics {r.get('numerics') or '-'}")
            for note in r.get("notes") or ():
                print(f"    {note}")
        if r.get("fault"):
            print(f"  {r['replica_id'][:10]} NOT ROUTED: {r['fault']}")
    if not rows:
        print("(no replica has reported engine stats yet)")
    for model, golden in data.get("golden", {}).items():
        if golden["state"] in ("pending", "failed"):  # kept out of routing (serve_apps/resilience/golden_gate.py)
            print(f"{model}: not routed: {golden['reason']}")
    for error in data["errors"]:
        print(f"warning: {error}")
    return 0
