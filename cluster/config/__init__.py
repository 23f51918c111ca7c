"""The deployment config: one YAML file per deployment, its sections as strict pydantic models, and
the generated reference docs/configuration.md.

    deployment.py  the root (`SpilloverConfig`), its `cluster`, `telemetry` and `admission` sections;
                   loading, overlays, errors naming each field's path
    base.py        the base of every section: unknown keys are errors, a validated config is frozen
    model_spec.py  one `models[]` entry: a local model, its engine and how it is served
    numerics.py    `models[].numerics`: the numerics check of a replica's engine
    perf.py        `models[].perf`: the fitted compute model and its SLO
    gateway.py     `gateway`, `tenants` and `state`: where the gateway listens, its replicas, who may call it,
                   the shared store of its replicas
    tenants.py     the gateway's tenants built from the config: keys from the environment, policies
    cloud.py       `cloud`: the cloud APIs requests may burst to
    routes.py      `routes`: a model name served by an ordered list of targets
    resilience.py  `resilience` and `spend`
    traffic.py     `traffic`: graded switches and their sharing, deferred requests' tickets
    session.py     `sessions`: pins, the state anchor, history compression
    learning.py    `learning`: quality, feedback, request typing
    docs.py        docs/configuration.md from the models (`python -m cluster.config.docs`)
"""

# The modules of this wing the rest of cluster/ may import: its doors (tests/unit/test_wing_doors.py).
DOORS: tuple[str, ...] = ("deployment", "model_spec", "numerics", "perf")
