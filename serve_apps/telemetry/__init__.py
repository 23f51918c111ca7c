"""What the gateway sees and tells: engine stats from each replica to the gateway through the telemetry
board, the gateway's metrics and its structured logs.

    stats_pusher.py  the replica side: read `ReplicaStats`, push them to the board
    board.py         TelemetryBoard: the named Ray actor replicas push to and the gateway reads
    board_reader.py  the gateway side: subscribe to the board, its rows as ClusterSnapshots
    metrics.py       the gateway's metrics at `GET /metrics`
    replica_metrics.py  every gateway replica's series through any replica's `GET /metrics` (shared store)
    logs.py          structured logs: one JSON object per line
"""

# The modules of this wing the rest of serve_apps/ may import: its doors (tests/unit/test_wing_doors.py).
DOORS: tuple[str, ...] = ("board", "board_reader", "logs", "metrics", "replica_metrics", "stats_pusher")
