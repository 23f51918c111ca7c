"""The load every bench command offers: workloads, the load generator, per-request results, stats, progress."""
