"""The cloud simulator's request log: one JSON line per `/v1/*` request it receives.

Each line is written (and flushed) when the simulator has decided what to answer, before
any latency, hang or fault plays out, so a request that later hangs or is cut is already in
the file. Fields: `time` (from the injected clock), `request_id` (the simulator's own id,
also sent back as `x-request-id`), `method`, `path`, `model`, `stream`, `headers` (only
`x-request-id` and `x-spillover-*` as received), `fault`, `error` (the error code answered,
or null) and `status` (the HTTP status sent, 200 for a stream that is later cut); for a chat,
`messages` (how many) and `system` (each system text, the Messages API's `system` included, clipped
to 2,000 characters): what a gateway put in front of the client's turns is visible, the turns are not
— unless the log was asked for the bodies (`--log-bodies`): then each file line also has `body`, the
request body exactly as it arrived (its first `BODY_BYTES`, with `body_truncated: true` beyond), to
check what a gateway sent; the records kept for `GET /control/log` never hold it (their memory stays
bounded). The Authorization header is never logged.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

LOGGED_HEADERS = frozenset({"x-request-id"})
LOGGED_HEADER_PREFIX = "x-spillover-"
SYSTEM_CHARS = 2000
BODY_BYTES = 1 << 20
BODY_FIELDS = ("body", "body_truncated")


def prompt_shape(body: Any) -> dict[str, Any]:
    """How many messages a chat body holds and its system texts (clipped); {} for anything else."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list):
        return {}
    system = [m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "system"]
    if isinstance(body.get("system"), str):
        system.insert(0, body["system"])
    texts = [t[:SYSTEM_CHARS] for t in system if isinstance(t, str)]
    return {"messages": len(messages), "system": texts[:20]}


def logged_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The request headers worth recording; never credentials."""
    return {
        name.lower(): value
        for name, value in headers.items()
        if name.lower() in LOGGED_HEADERS or name.lower().startswith(LOGGED_HEADER_PREFIX)
    }


class RequestLog:
    """Appends JSON lines to `path` (none when it is None) and keeps the last `keep` records in
    memory for `GET /control/log` (the fault bench reads it over HTTP, wherever the file is)."""

    def __init__(self, path: str | Path | None, *, keep: int = 10_000, bodies: bool = False) -> None:
        self._path = Path(path) if path is not None else None
        self._recent: deque[dict[str, Any]] = deque(maxlen=keep)
        self._bodies = bodies and self._path is not None

    def body_fields(self, raw: bytes) -> dict[str, Any]:
        """The body fields of a request's record: {} unless the log keeps bodies."""
        if not self._bodies:
            return {}
        fields: dict[str, Any] = {"body": raw[:BODY_BYTES].decode("utf-8", "replace")}
        if len(raw) > BODY_BYTES:
            fields["body_truncated"] = True
        return fields

    def recent(self, gateway_request_id: str | None = None) -> list[dict[str, Any]]:
        """Kept records, oldest first; only those whose forwarded `x-request-id` matches, if given."""
        rows = list(self._recent)
        if gateway_request_id is None:
            return rows
        return [r for r in rows if r.get("headers", {}).get("x-request-id") == gateway_request_id]

    def write(self, record: Mapping[str, Any]) -> None:
        self._recent.append({k: v for k, v in record.items() if k not in BODY_FIELDS})
        if self._path is None:
            return
        line = json.dumps(dict(record), separators=(",", ":"), default=str)
        with self._path.open("a", encoding="utf-8") as handle:
            handle.write(line + "\n")
            handle.flush()
