"""The decision log's file sink (`gateway.decisions_log`): one JSON line per decision record.

The store (router/learning/decision.py) calls it from the background writer's thread, never on the loop.
"""

from __future__ import annotations


class JsonlFile:
    """A decision-log sink: appends one line per call to the file at `path`."""

    def __init__(self, path: str) -> None:
        self._path = path

    def __call__(self, line: str) -> None:
        with open(self._path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
