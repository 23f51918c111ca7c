"""How a fault changes a streamed reply of the cloud simulator (the events and their delays).

malformed       the first token event is replaced by an event whose `data:` is not JSON
malformed_event one event that is not JSON is inserted between two token events (nothing is lost:
                a stream a tolerant client can finish)
no_done         every event but the last: no `data: [DONE]` (the Messages API: no message_stop),
                after the finish_reason and the usage; the connection closes cleanly
midstream_cut   the stream stops after `cut_after_tokens` token events (default half of them),
                without its final chunk, and the connection drops
"""

from __future__ import annotations

from bench.cloud_sim.faults import Fault
from bench.cloud_sim.settings import SimSettings


def faulty_stream(
    fault: Fault,
    events: list[str],
    delays: list[float],
    *,
    first: int,
    n_tokens: int,
    malformed: str,
    settings: SimSettings,
) -> tuple[list[str], list[float]]:
    """The events and delays `fault` leaves of a stream (`first`: index of the first token event)."""
    if fault is Fault.MALFORMED:
        events = [*events[:first], malformed, *events[first + 1 :]]
    elif fault is Fault.MALFORMED_EVENT:
        at = first + max(1, n_tokens // 2)
        events, delays = [*events[:at], malformed, *events[at:]], [*delays[:at], 0.0, *delays[at:]]
    elif fault is Fault.NO_DONE:
        events, delays = events[:-1], delays[:-1]
    elif fault is Fault.MIDSTREAM_CUT:
        tokens = settings.cut_after_tokens if settings.cut_after_tokens is not None else max(1, n_tokens // 2)
        keep = first + min(tokens, n_tokens)
        events, delays = events[:keep], delays[:keep]
    return events, delays
