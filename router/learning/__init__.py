"""Learning from what happened: decision records and the inputs a replay needs, late feedback,
per-bucket quality and offline policy replay.

    quality.py          per-bucket quality learned from outcomes
    feedback.py         late feedback on answered requests
    decision.py         decision records: where a request went and why
    decision_inputs.py  what a replay needs of a decision record
    replay.py           offline replay of a new policy over recorded decisions
"""

# The modules of this wing the other wings of router/ may import: its doors (tests/unit/test_wing_doors.py).
DOORS: tuple[str, ...] = ()
