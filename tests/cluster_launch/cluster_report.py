"""Run on a node of the cluster: what Ray itself reports, as one JSON line after `MARKER`.

    python tests/cluster_launch/cluster_report.py [--wait-nodes N] [--timeout-s S]

`nodes`: every node Ray knows (id, IP, alive, CPU); `actors`: every live actor (id, PID) with the IP of
the node it runs on (Serve replicas are `ServeReplica:<app>:<deployment>`), from Ray's state API.
With --wait-nodes it first waits until that many nodes are alive (the head's autoscaler brings
the workers up after `ray up` returns).
"""

from __future__ import annotations

import argparse
import json
import time

import ray
from ray.util.state import list_actors

MARKER = "CLUSTER_REPORT "


def report(wait_nodes: int, timeout_s: float) -> dict[str, object]:
    ray.init(address="auto", log_to_driver=False, logging_level="ERROR")
    deadline = time.monotonic() + timeout_s
    while sum(n["Alive"] for n in ray.nodes()) < wait_nodes and time.monotonic() < deadline:
        time.sleep(1)
    nodes = ray.nodes()
    ip_of = {n["NodeID"]: n["NodeManagerAddress"] for n in nodes}
    actors = list_actors(filters=[("state", "=", "ALIVE")], limit=10_000, raise_on_missing_output=False)
    return {
        "nodes": [
            {
                "id": n["NodeID"],
                "ip": n["NodeManagerAddress"],
                "alive": n["Alive"],
                "cpus": n["Resources"].get("CPU", 0),
                "head": "node:__internal_head__" in n["Resources"],
            }
            for n in nodes
        ],
        "actors": [
            {"class": a.class_name, "id": a.actor_id, "pid": a.pid, "node_id": a.node_id, "ip": ip_of.get(a.node_id)}
            for a in actors
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--wait-nodes", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=0)
    args = parser.parse_args()
    print(MARKER + json.dumps(report(args.wait_nodes, args.timeout_s)), flush=True)


if __name__ == "__main__":
    main()
