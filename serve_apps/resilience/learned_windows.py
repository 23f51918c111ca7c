"""What the gateway learnt of its targets' real context windows from their answers.

A provider that answers 400 `context_length_exceeded` (or the Messages API's "prompt is too long")
for a request of N tokens (estimated prompt + max_tokens) has a real window below N, whatever its
configured `context_window` says. `LearnedWindows` keeps, per target, the smallest such N: later
requests of at least N tokens treat the target as unavailable for them (plan time) and skip it in
the attempt loop, so they go to a target with a larger window at once; smaller requests still go
there. Never truncating: a request no target can hold ends as the client error it is. Kept per
gateway replica (in its `Resilience`) until it restarts or an operator resets the target
(`POST /v1/spillover/resilience/reset`).
"""

from __future__ import annotations

from collections.abc import Iterable

from router.routing.capabilities import Target


class LearnedWindows:
    def __init__(self) -> None:
        self._refused_at: dict[str, int] = {}  # target id -> smallest request size it refused

    def refused(self, target: Target, tokens: int) -> None:
        """`target` refused a request of `tokens` tokens as too long for its window."""
        if tokens > 0:
            self._refused_at[target.id] = min(tokens, self._refused_at.get(target.id, tokens))

    def too_small(self, target: Target, tokens: int) -> str | None:
        """Why `target` cannot hold a request of `tokens` tokens (None: it may)."""
        limit = self._refused_at.get(target.id)
        if limit is None or tokens < limit:
            return None
        return f"refused a prompt of {limit} tokens as too long for its window (learnt; this request needs {tokens})"

    def unavailable(self, targets: Iterable[Target], tokens: int) -> dict[str, str]:
        """The targets too small for `tokens`, by id, with why (for the plan's unavailable map)."""
        return {t.id: why for t in targets if (why := self.too_small(t, tokens)) is not None}

    def reset(self, target: str | None = None) -> list[str]:
        """Forget what was learnt of one target (its id, or its health key `cloud:<provider>`), or
        of every target; returns the ids forgotten."""
        gone = [t for t in self._refused_at if target is None or t == target or t.startswith(f"{target}/")]
        for target_id in gone:
            del self._refused_at[target_id]
        return [f"window:{t}" for t in gone]
