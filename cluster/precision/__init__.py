"""Which precision a vLLM-CPU engine runs in, and whether it computes the model right (docs/dtype.md).

    choice.py              the dtype and compile mode chosen on the CPU an engine runs on
    known.py               bf16 verdicts the project measured and ships
    memory.py              what a node learnt of bf16 on its CPU, kept for the next start
    local.py               the choice on *this* machine, with what the node knows
    numerics_reference.py  the float32 reference a model's numerics are checked against
    numerics_check.py      an engine's greedy tokens against that reference

A model replica applies the choice before its engine starts and checks its engine against the
reference; `spillover capacity` uses the choice for the KV arithmetic.
"""

# The modules of this wing the rest of cluster/ may import: its doors (tests/unit/test_wing_doors.py).
DOORS: tuple[str, ...] = ("local", "numerics_reference")
