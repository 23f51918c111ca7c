"""Work that must not run on the gateway's event loop (one asyncio loop serves every request of a replica):
the CPU-bound checks of client schemas and answers, and the writes to SQLite and files.

    check_pool.py         CheckPool: the CPU-bound request checks in a small thread pool shared fairly by tenants
    background_writer.py  BackgroundWriter: writes (ledger rows, decision log lines) drained by one daemon thread
"""

# The modules of this wing the rest of serve_apps/ may import: its doors (tests/unit/test_wing_doors.py).
DOORS: tuple[str, ...] = ("background_writer", "check_pool")
