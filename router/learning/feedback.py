"""Late feedback on an answered request: `POST /v1/spillover/feedback` bodies and where they are kept.

    {"request_id": "...", "outcome": "success" | "failure", "label": "...", "source": "..."}

`parse_feedback(raw)` validates a body: a JSON object with only these keys; `request_id` 1-128
printable ASCII characters (as `x-request-id`); `outcome` success or failure (a client's business
failure report is `failure`); `source` (who judged: "user-thumbs", "qa-batch", ...) and the optional
`label` (a scenario name, or any tag) 1-64 of letters, digits and `_ . : -`. Anything else is a 400
`invalid_feedback` naming the field.

One verdict per request and source KIND: the kind is the source's first word (up to the first
`- _ . :`) when that word is one of `SOURCE_KINDS` (`user-thumbs` is `user`, `qa-batch-7` is `qa`),
else `other`. A second report of the same kind on the same request is 409 `feedback_exists`,
whatever its free text: a client cannot outvote others by repeating itself under new names.

`FeedbackStore` keeps the last `max_entries` reports with their owner (tenant), source, kind and the
wall time they arrived (the clock is injected). Pure: no I/O.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal

from router.error_codes import ErrorCode
from router.errors import FeedbackExists, InvalidRequest
from router.request.openai_request import decode_json

FeedbackOutcome = Literal["success", "failure"]
FIELDS = frozenset({"request_id", "outcome", "label", "source"})
_REQUEST_ID = re.compile(r"[\x21-\x7e]{1,128}")
_TAG = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
MAX_FEEDBACK_BYTES = 4096
SOURCE_KINDS = ("user", "qa", "business")  # a source's kind: its first word when it is one of these, else other
_FIRST_WORD = re.compile(r"[^_.:-]*")


def source_kind(source: str) -> str:
    """`user`, `qa`, `business` or `other`: what one request may get one verdict from."""
    match = _FIRST_WORD.match(source)
    word = match.group(0).lower() if match is not None else ""
    return word if word in SOURCE_KINDS else "other"


@dataclass(frozen=True)
class FeedbackInput:
    request_id: str
    outcome: FeedbackOutcome
    source: str
    label: str | None = None


@dataclass(frozen=True)
class Feedback:
    request_id: str
    owner: str
    outcome: FeedbackOutcome
    source: str
    label: str | None
    received_at: float  # wall time, epoch seconds

    def to_dict(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "outcome": self.outcome,
            "source": self.source,
            "kind": source_kind(self.source),
            "label": self.label,
            "received_at": self.received_at,
        }


def _bad(message: str, param: str | None) -> InvalidRequest:
    return InvalidRequest(message, param=param, code=ErrorCode.INVALID_FEEDBACK)


def parse_feedback(raw: bytes) -> FeedbackInput:
    if len(raw) > MAX_FEEDBACK_BYTES:
        raise _bad(f"a feedback body is at most {MAX_FEEDBACK_BYTES} bytes", None)
    try:
        body = decode_json(raw)  # nesting, NaN and lone surrogates are a 400, never a RecursionError's 500
    except InvalidRequest as exc:
        raise _bad(f"the body must be a JSON object: {exc.message}", None) from None
    if not isinstance(body, dict):
        raise _bad("the body must be a JSON object", None)
    extra = sorted(str(k)[:40] for k in set(body) - FIELDS)
    if extra:
        raise _bad(f"unknown fields {extra}; known: {sorted(FIELDS)}", extra[0])
    request_id, outcome, source, label = (body.get(k) for k in ("request_id", "outcome", "source", "label"))
    if not isinstance(request_id, str) or not _REQUEST_ID.fullmatch(request_id):
        raise _bad("request_id must be 1-128 printable ASCII characters (the answer's x-request-id)", "request_id")
    if outcome not in ("success", "failure"):
        raise _bad("outcome must be success or failure", "outcome")
    if not isinstance(source, str) or not _TAG.fullmatch(source):
        raise _bad("source is required: 1-64 letters, digits, _ . : -", "source")
    if label is not None and (not isinstance(label, str) or not _TAG.fullmatch(label)):
        raise _bad("label must be 1-64 letters, digits, _ . : -", "label")
    return FeedbackInput(request_id, outcome, source, label)


class FeedbackStore:
    def __init__(self, max_entries: int = 10000) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        self._max = max_entries
        self._entries: OrderedDict[tuple[str, str, str], Feedback] = OrderedDict()  # (owner, request, kind)

    def add(self, feedback: Feedback) -> None:
        """Raises FeedbackExists for a second report of the same source kind on the same request."""
        kind = source_kind(feedback.source)
        key = (feedback.owner, feedback.request_id, kind)
        if key in self._entries:
            raise FeedbackExists(
                f"feedback of source kind {kind!r} on request {feedback.request_id!r} is already recorded "
                f"(one verdict per request and kind: {', '.join((*SOURCE_KINDS, 'other'))})"
            )
        self._entries[key] = feedback
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)

    def for_request(self, request_id: str, owner: str) -> list[Feedback]:
        return [f for (o, r, _), f in self._entries.items() if o == owner and r == request_id]

    def __len__(self) -> int:
        return len(self._entries)
