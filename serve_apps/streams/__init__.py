"""Answers as they arrive: a stream counted as it passes, checked against the output contract, booked
when it ends and continued on another target when it breaks; the output contract and the loop check
applied to a complete answer.

    account.py       a stream counted: tokens, how it ended, its answer
    contract.py      the output contract applied to streamed answers
    record.py        booking a streamed attempt when its stream ends
    continuation.py  a stream broken after its first byte, continued on the next target and spliced
    output_check.py  the output contract applied to a complete chat answer (off the loop)
    output_loops.py  the live-answer loop check
"""

# The modules of this wing the rest of serve_apps/ may import: its doors (tests/unit/test_wing_doors.py).
DOORS: tuple[str, ...] = ("account", "continuation", "contract", "output_check", "output_loops", "record")
