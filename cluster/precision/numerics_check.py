"""Does an engine compute the model right? Its greedy tokens against the float32 reference. Pure.

A golden string cannot tell a weak model from a broken kernel: SmolLM2-135M answers some capitals
wrong in float32 too, and a broken bf16 path still said "Paris" to the golden prompt. The reference
(cluster/precision/numerics_reference.py) holds the float32 greedy tokens of the same weights for fixed prompts;
the engine is given the same token ids at temperature 0 and must reproduce them.

Per prompt the check counts the leading tokens that agree with the reference (a reply that stopped
where the reference stopped agrees in full). A prompt *agrees* when its first `first_tokens` do; the
engine passes when at least `min_agreeing` of the prompts agree — a share per dtype: float32 must
agree on every prompt, bfloat16 (8 bits of mantissa: a near tie between two tokens can flip) on a
stated share (`models[].numerics.min_agreeing_bf16`). A broken kernel does not flip one near tie: it
departs within a few tokens on most prompts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

State = Literal["pending", "passed", "failed", "unchecked"]


@dataclass(frozen=True)
class NumericsVerdict:
    state: State
    reason: str
    agreement: tuple[int, ...] = ()  # leading tokens agreeing, per prompt

    @property
    def routable(self) -> bool:
        return self.state in ("passed", "unchecked")

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "reason": self.reason, "agreement": list(self.agreement)}


def agreeing_prefix(want: Sequence[int], got: Sequence[int]) -> int:
    """Leading tokens in common (the reference's end of sequence is one of its tokens, so a reply that
    ends where the reference ends agrees in full, and one that goes on past it agrees as far as it)."""
    n = 0
    for a, b in zip(want, got, strict=False):
        if a != b:
            break
        n += 1
    return n


def judge(
    reference: Mapping[str, Any],
    got: Sequence[Sequence[int]],
    *,
    first_tokens: int,
    min_agreeing: float,
    label: str,
) -> NumericsVerdict:
    """`got[i]`: the engine's greedy tokens for the reference's i-th prompt; `label`: what ran (dtype)."""
    prompts = list(reference.get("prompts", ()))
    if len(got) != len(prompts) or not prompts:
        return NumericsVerdict("failed", f"numerics check: {len(got)} replies for {len(prompts)} reference prompts")
    agreement = tuple(agreeing_prefix(p["token_ids"], tokens) for p, tokens in zip(prompts, got, strict=True))
    need = [min(first_tokens, len(p["token_ids"])) for p in prompts]
    agreeing = sum(a >= n for a, n in zip(agreement, need, strict=True))
    required = max(1, math.ceil(round(min_agreeing * len(prompts), 6)))
    summary = (
        f"{agreeing}/{len(prompts)} prompts agree with the float32 reference on their first {first_tokens} "
        f"greedy tokens ({label}; {required} required)"
    )
    if agreeing >= required:
        return NumericsVerdict("passed", f"numerics check passed: {summary}", agreement)
    worst = [
        f"{p.get('name', i)}: {a}" for i, (p, a, n) in enumerate(zip(prompts, agreement, need, strict=True)) if a < n
    ]
    return NumericsVerdict(
        "failed",
        f"numerics check failed: {summary}; tokens agreeing where they departed: {', '.join(worst)}",
        agreement,
    )
