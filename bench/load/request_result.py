"""What one load-test request measured: `RequestResult`.

Times are seconds from the load generator's clock, `start_s` relative to its origin (the start
of the stage), so results of one stage share a time line:

    ttft_s    start → first content (or tool-call) chunk; None when none arrived
    e2e_s     start → the end of the response (`[DONE]`, the error, or the cut)
    tpot_s    (e2e − ttft) / (output tokens − 1): time per output token after the first
              (vLLM's definition); None with fewer than two output tokens

`error` is None for a complete answer, else a short code: the OpenAI error `code` of the body
(`capacity_exceeded`, `local_capacity_exhausted`, ...), `http_<status>` when the body has none,
`stream_error` (an error event inside the stream), `stream_cut` (the stream ended without
`[DONE]`), `malformed` (a `data:` payload that is not JSON), `timeout`, `connect_error`,
`http_error`, or `cancelled` (still running when the level's time limit ended it; such results
count neither as errors nor in latencies).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

CANCELLED = "cancelled"


@dataclass(frozen=True)
class RequestResult:
    index: int
    start_s: float
    e2e_s: float
    ttft_s: float | None = None
    output_tokens: int = 0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    status: int | None = None
    error: str | None = None
    route: str | None = None
    target: str | None = None
    warmup: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def cancelled(self) -> bool:
        return self.error == CANCELLED

    @property
    def end_s(self) -> float:
        return self.start_s + self.e2e_s

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.output_tokens < 2:
            return None
        return max(0.0, self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "tpot_s": self.tpot_s}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RequestResult:
        fields = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in fields})
