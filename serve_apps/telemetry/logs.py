"""Structured logs: one JSON object per line for the `spillover.*` loggers.

Fields: `time`, `level`, `logger`, `message`, and whatever the call passed in `extra=` among
`LOGGED_FIELDS` (request id, route, target, reason, status, code, ...). Request bodies
(prompts) and API keys are never passed to a log call, so they never appear here.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import msgspec

_ENCODER = msgspec.json.Encoder(enc_hook=str)  # what JSON has no type for is written as its str(), as before
LOGGED_FIELDS = ("request_id", "model", "route", "target", "reason", "status", "code", "waited_s")


class JsonLineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data = {
            "time": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        data.update({k: getattr(record, k) for k in LOGGED_FIELDS if hasattr(record, k)})
        if record.exc_info:
            data["error"] = self.formatException(record.exc_info).splitlines()[-1]
        return _ENCODER.encode(data).decode()  # one line a request ("routed"): msgspec, several times json's speed


def configure_json_logs(name: str = "spillover", stream: TextIO | None = None, level: int = logging.INFO) -> None:
    """Send `name` and its children as JSON lines to `stream` (stderr), once per process."""
    logger = logging.getLogger(name)
    if any(isinstance(h.formatter, JsonLineFormatter) for h in logger.handlers):
        return
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonLineFormatter())
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
