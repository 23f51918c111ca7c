"""Conversations across turns, on the gateway: the dispatcher's side of a session, the pin table shared by
every gateway replica, the stored history and the summaries of older turns.

    turns.py      Sessions and Turn: read the pin, steer the plan, carry the state on a switch
    pins.py       the shared pin table and each replica's cache of it
    history.py    server-side session history (`sessions.store`)
    summaries.py  summaries of a session's older turns by the local summariser model
    actor.py      the pin table and history as named, detached Ray actors on the head node
"""

# The modules of this wing the rest of serve_apps/ may import: its doors (tests/unit/test_wing_doors.py).
DOORS: tuple[str, ...] = ("actor", "history", "pins", "turns")
