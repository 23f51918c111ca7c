"""Checking answers: output contracts, streamed answers reassembled for checking, and the greedy-loop
check.

    output_contract.py  does an answer deliver what the contract asked for
    tool_calls.py       a streamed answer put back together from its chunks
    degenerate.py       did greedy decoding fall into a loop
"""

# The modules of this wing the other wings of router/ may import: its doors (tests/unit/test_wing_doors.py).
DOORS: tuple[str, ...] = ()
