"""The operator's traffic controls: the versioned traffic document, graded migrations between targets
and tickets for deferred requests.

    traffic.py    the versioned traffic document
    migration.py  graded migration between targets, with gates
    tickets.py    tickets for deferred requests
"""

# The modules of this wing the other wings of router/ may import: its doors (tests/unit/test_wing_doors.py).
DOORS: tuple[str, ...] = ("migration",)
