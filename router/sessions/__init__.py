"""Conversations across turns: session ids and pinning, server-side history, the state anchor and
carried state on a switch, context compression, cached summaries and the tenant-fair bounded store
they live in.

    sessions.py       which conversation a request is, and its pinned target
    session_id.py     the session id, from headers or the body
    history.py        server-side history: merging and bounding
    anchor.py         the state anchor carried to a new target
    carried.py        carried state keeps its turns' constraints
    compress.py       fitting a conversation into a smaller window
    summary_cache.py  summaries of older turns, kept for later turns
    tenant_lru.py     a bounded store that evicts from the largest tenant
"""

# The modules of this wing the other wings of router/ may import: its doors (tests/unit/test_wing_doors.py).
DOORS: tuple[str, ...] = ("carried", "session_id")
