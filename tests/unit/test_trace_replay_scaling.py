"""Fitting a trace to a small box (bench/replay/scaling.py) and its prompts (bench/replay/prompts.py): seeded,
never reordering, windows, thinning, stretching, token caps, and prefix sharing kept within a policy but not
across policies (a later policy must not find an earlier one's prompts in the prefix cache)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.replay.prompts import PromptBuilder
from bench.replay.scaling import Scaling, busiest, scale_trace, spread
from bench.replay.traces import Trace, TraceError, TraceRequest


def trace(times: list[float], *, prompt: int = 1000, output: int = 100, blocks: bool = True) -> Trace:
    requests = tuple(
        TraceRequest(t, prompt, output, (0, 1, 10 + i) if blocks else (), line=i + 1) for i, t in enumerate(times)
    )
    return Trace("mooncake" if blocks else "azure", requests, 0, 512 if blocks else None)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=60).map(lambda xs: sorted(map(float, xs))),
    st.floats(min_value=0, max_value=10),
    st.integers(min_value=0, max_value=5),
)
def test_spreading_never_reorders_and_stays_in_its_bucket(times: list[float], width: float, seed: int) -> None:
    t = trace(times)
    out = spread(t.requests, width, random.Random(seed))
    assert out == sorted(out)  # file order kept
    distinct = sorted(set(times))
    for before, after in zip(times, out, strict=True):
        following = [d for d in distinct if d > before]
        bound = min(before + width, following[0]) if following else before + width
        assert before <= after <= bound  # < bound but for rounding: t + offset may round up to it


def test_spreading_is_seeded() -> None:
    t = trace([0.0] * 10 + [3.0] * 5)
    assert spread(t.requests, 3, random.Random(1)) == spread(t.requests, 3, random.Random(1))
    assert spread(t.requests, 3, random.Random(1)) != spread(t.requests, 3, random.Random(2))


def test_busiest_window() -> None:
    times = [0.0, 1, 2, 50, 50.5, 51, 51.5, 52, 100]
    assert busiest(times, 3) == 50
    assert busiest([5.0], 10) == 5


def test_window_thinning_stretching_and_counts() -> None:
    times = [float(i) for i in range(100)]
    whole = scale_trace(trace(times), Scaling())
    assert len(whole.requests) == 100 and whole.requests[0].arrival_s == 0
    window = scale_trace(trace(times), Scaling(window_s=10, window_at=20))
    assert [r.arrival_s for r in window.requests] == [float(i) for i in range(10)]
    assert window.window_start_s == 20 and window.window_s == 10
    stretched = scale_trace(trace(times), Scaling(window_s=10, window_at=20, stretch=2.5))
    assert [r.arrival_s for r in stretched.requests] == [2.5 * i for i in range(10)] and stretched.window_s == 25
    thin_a = scale_trace(trace(times), Scaling(keep=0.3, seed=4))
    thin_b = scale_trace(trace(times), Scaling(keep=0.3, seed=4))
    assert [r.trace_line for r in thin_a.requests] == [r.trace_line for r in thin_b.requests]
    assert 15 <= len(thin_a.requests) <= 45
    assert [r.trace_line for r in thin_a.requests] == sorted(r.trace_line for r in thin_a.requests)
    assert len(scale_trace(trace(times), Scaling(max_requests=7)).requests) == 7


def test_token_scaling_and_caps() -> None:
    t = trace([0.0, 1.0], prompt=10_000, output=300)
    scaled = scale_trace(t, Scaling(input_scale=0.02, output_scale=0.1))
    assert [(r.input_tokens, r.output_tokens) for r in scaled.requests] == [(200, 30)] * 2
    assert scaled.requests[0].block_words == 10  # 512 × 0.02, rounded
    capped = scale_trace(t, Scaling(input_scale=1, output_scale=1, max_output=64, context_window=4096))
    assert [(r.input_tokens, r.output_tokens) for r in capped.requests] == [(4032, 64)] * 2 and capped.capped == 2
    assert scale_trace(t, Scaling(input_scale=0.02, max_input=50)).requests[0].input_tokens == 50
    tiny = scale_trace(trace([0.0], prompt=1, output=1), Scaling(input_scale=0.001, output_scale=0.001))
    assert (tiny.requests[0].input_tokens, tiny.requests[0].output_tokens) == (1, 1)


@pytest.mark.parametrize(
    ("scaling", "message"),
    [
        (Scaling(keep=0), "--keep"),
        (Scaling(keep=1.5), "--keep"),
        (Scaling(stretch=0), "--stretch"),
        (Scaling(input_scale=float("nan")), "--input-scale"),
        (Scaling(window_s=-1), "--window-s"),
        (Scaling(window_s=10, window_at=-3), "--window-at"),
        (Scaling(max_output=0), "--max-output"),
        (Scaling(context_window=1), "--context-window"),
    ],
)
def test_bad_scaling(scaling: Scaling, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        scale_trace(trace([0.0]), scaling)


def test_a_window_past_the_end_or_empty() -> None:
    with pytest.raises(TraceError, match="past the trace's end"):
        scale_trace(trace([0.0, 5.0]), Scaling(window_s=10, window_at=100))
    with pytest.raises(TraceError, match="no request left"):
        scale_trace(trace([0.0, 50.0]), Scaling(window_s=10, window_at=20))


def test_prompts_keep_prefix_sharing_within_a_salt_and_not_across() -> None:
    t = trace([0.0, 1.0, 2.0])  # blocks (0, 1, 10), (0, 1, 11), (0, 1, 12)
    scaled = scale_trace(t, Scaling(input_scale=0.01, output_scale=0.1))  # 5-word blocks, 10-word prompts
    a = [PromptBuilder(0, "shipped").item(i, r) for i, r in enumerate(scaled.requests)]
    again = [PromptBuilder(0, "shipped").item(i, r) for i, r in enumerate(scaled.requests)]
    b = [PromptBuilder(0, "local").item(i, r) for i, r in enumerate(scaled.requests)]
    words = [item.messages[0]["content"].split() for item in a]
    assert all(len(w) == 10 == item.prompt_words for w, item in zip(words, a, strict=True))
    assert words[0][:10] == words[1][:10] == words[2][:10]  # blocks 0 and 1 are 10 words: the same prefix
    assert [i.messages for i in a] == [i.messages for i in again]
    other = [item.messages[0]["content"].split() for item in b]
    assert all(x[:5] != y[:5] for x, y in zip(words, other, strict=True))  # another salt: another prefix
    assert [i.max_tokens for i in a] == [i.max_tokens for i in b] == [10, 10, 10]


def test_prompts_without_blocks_and_longer_than_their_blocks() -> None:
    t = trace([0.0, 1.0], prompt=2000, blocks=False)
    items = [PromptBuilder(3).item(i, r) for i, r in enumerate(scale_trace(t, Scaling(input_scale=0.01)).requests)]
    assert [i.prompt_words for i in items] == [20, 20]
    assert items[0].messages != items[1].messages
    long = scale_trace(trace([0.0], prompt=100_000), Scaling(input_scale=0.01, context_window=8192))
    item = PromptBuilder(0).item(0, long.requests[0])  # 3 blocks of 5 words, then its own words
    assert item.prompt_words == 1000
