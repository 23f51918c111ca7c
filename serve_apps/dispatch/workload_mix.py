"""The live workload mix per model: mean prompt and output tokens of its most recent requests.

Each request the gateway dispatches adds (estimated prompt tokens, max output tokens) from its
contract (router/request/contract.py) to its model's window of the last `size` requests; outputs are
counted at the request's cap, an upper bound that keeps the admission limit on the safe side.
The gateway's admission limit reads the means (serve_apps/dispatch/admission.py). Owned by one gateway
replica, used on its event loop.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass

DEFAULT_WINDOW = 64


@dataclass(frozen=True)
class Mix:
    prompt_tokens: float
    output_tokens: float
    requests: int


class WorkloadMix:
    def __init__(self, size: int = DEFAULT_WINDOW) -> None:
        if size < 1:
            raise ValueError("the window holds at least one request")
        self._size = size
        self._recent: dict[str, deque[tuple[int, int]]] = defaultdict(lambda: deque(maxlen=self._size))

    def observe(self, model: str, prompt_tokens: int, output_tokens: int) -> None:
        self._recent[model].append((max(0, prompt_tokens), max(1, output_tokens)))

    def mean(self, model: str) -> Mix | None:
        """The window's means, or None before the model's first request."""
        recent = self._recent.get(model)
        if not recent:
            return None
        count = len(recent)
        return Mix(sum(p for p, _ in recent) / count, sum(o for _, o in recent) / count, count)
