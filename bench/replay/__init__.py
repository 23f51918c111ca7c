"""`bench replay`: replay a production arrival trace through the gateway per policy (bench/replay/run.py)."""
