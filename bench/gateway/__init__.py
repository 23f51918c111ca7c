"""The gateway layer, not the model: fault matrix, ingress overhead and throughput, affinity, CPU profiles."""
