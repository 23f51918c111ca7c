"""How much a replica can hold: the KV-memory bound, the compute model and its fit, and the
admission limit min(memory, compute) (docs/capacity.md).

    model_shape.py     a model's shape: layers, heads, dtypes; KV bytes per token, weights
    memory.py          the KV-memory capacity model: sequences one replica can hold
    plan.py            per model, the capacity plan: shape, engine settings, then the KV arithmetic
    compute_model.py   an engine step's time and what follows from it
    engine_sim.py      a step-level simulation of one vLLM engine under a closed loop
    compute_knee.py    the compute bound: the largest concurrency within the SLO
    compute_fit.py     the compute model's parameters fitted from measured runs (linear stage)
    compute_refine.py  the second stage of the fit, on simulated runs
    bound.py           the admission limit: min(memory bound, compute bound), the binding one named
"""

# The modules of this wing the rest of cluster/ may import: its doors (tests/unit/test_wing_doors.py).
DOORS: tuple[str, ...] = ("compute_model", "engine_sim")
