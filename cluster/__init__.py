"""What the cluster has and can hold, the layer over router/: one sub-package ("wing") per feature.

    config/     the deployment config: its sections, loading, the generated docs/configuration.md
    capacity/   the KV-memory bound, the compute model and its fit, the admission limit
    hardware/   CPU capabilities and core binding, NVML (real, fake, simulated), GPU memory by owner
    precision/  a vLLM-CPU engine's precision and its numerics check against the float32 reference

What the other layers reach directly stays here: models.py (the model catalog, `spillover models`),
render.py (the Serve config `spillover render` writes), engine_settings.py (what a replica knows of
its engine), stats_tap.py (the vLLM stat logger), decision_log_reader.py (a decision log for replay)
and grafana-dashboard.json.
"""
