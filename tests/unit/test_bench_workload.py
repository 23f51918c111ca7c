"""bench.load.workload: length specs, seeded requests, shared prefixes and Poisson arrivals."""

from __future__ import annotations

import random
import statistics

import pytest

from bench.load.workload import WORDS, LengthDist, RequestFactory, WorkloadError, WorkloadSpec, poisson_arrivals


@pytest.mark.parametrize(
    ("text", "kind", "low", "high", "mean"),
    [
        ("fixed:64", "fixed", 64, 64, 64),
        (" uniform:32-128 ", "uniform", 32, 128, 80),
        ("lognormal:256", "lognormal", 1, 8 * 256, 256),
        ("lognormal:100,0.8", "lognormal", 1, 800, 100),
    ],
)
def test_length_specs_parse(text: str, kind: str, low: int, high: int, mean: float) -> None:
    dist = LengthDist.parse(text)
    assert dist.kind == kind
    assert dist.bounds == (low, high)
    assert dist.mean == mean
    assert LengthDist.parse(str(dist)) == dist


@pytest.mark.parametrize(
    "text", ["", "64", "fixed:", "fixed:0", "fixed:x", "uniform:10", "uniform:9-3", "normal:5", "lognormal:10,9"]
)
def test_bad_length_specs_say_the_right_form(text: str) -> None:
    with pytest.raises(WorkloadError, match=r"fixed:64|>= 1|sigma"):
        LengthDist.parse(text)


@pytest.mark.parametrize("text", ["fixed:7", "uniform:3-9", "lognormal:50", "lognormal:50,1.5"])
def test_samples_stay_within_bounds(text: str) -> None:
    dist = LengthDist.parse(text)
    rng = random.Random(11)
    low, high = dist.bounds
    samples = [dist.sample(rng) for _ in range(3000)]
    assert all(low <= s <= high for s in samples)
    if dist.sigma <= 1:  # with a heavier tail the clamp at 8 × mean lowers the mean noticeably
        assert statistics.fmean(samples) == pytest.approx(dist.mean, rel=0.1)
    if dist.kind == "uniform":
        assert set(samples) == set(range(low, high + 1))


def spec(prompt: str = "fixed:32", output: str = "fixed:8", **kw: object) -> WorkloadSpec:
    return WorkloadSpec(LengthDist.parse(prompt), LengthDist.parse(output), **kw)  # type: ignore[arg-type]


def test_same_seed_same_requests_other_seed_other_requests() -> None:
    workload = spec("uniform:10-40", "uniform:4-16", prefix_share=0.5)
    first = RequestFactory(workload, random.Random(5)).take(50)
    again = RequestFactory(workload, random.Random(5)).take(50)
    other = RequestFactory(workload, random.Random(6)).take(50)
    assert first == again
    assert first != other
    assert [item.index for item in first] == list(range(50))


def test_prompts_are_words_of_the_requested_length() -> None:
    items = RequestFactory(spec("fixed:32", "fixed:8"), random.Random(1)).take(20)
    for item in items:
        (message,) = item.messages
        assert message["role"] == "user"
        words = message["content"].split()
        assert len(words) == item.prompt_words == 32
        assert set(words) <= set(WORDS)
        assert item.max_tokens == 8
        assert item.prefix_id is None
    assert len({item.messages[0]["content"] for item in items}) == 20  # no accidental sharing


def test_prefix_share_and_reused_system_prompts() -> None:
    workload = spec("fixed:40", prefix_share=0.3, prefix_count=3)
    factory = RequestFactory(workload, random.Random(2))
    items = factory.take(1000) + factory.take(1000)  # two levels share the same prefixes
    prefixed = [item for item in items if item.prefix_id is not None]
    assert len(prefixed) / len(items) == pytest.approx(0.3, abs=0.04)
    assert len(factory.prefixes) == 3
    systems = {item.messages[0]["content"] for item in prefixed}
    assert systems == set(factory.prefixes)
    for item in prefixed:
        system, user = item.messages
        assert system == {"role": "system", "content": factory.prefixes[item.prefix_id or 0]}
        assert len(system["content"].split()) == workload.system_prompt_words == 20
        assert len(user["content"].split()) == 40 - 20
        assert item.prompt_words == 40


def test_formula_prefix_share_is_the_expected_shared_fraction() -> None:
    assert spec("fixed:100").formula_prefix_share() == 0
    assert spec("fixed:100", prefix_share=0.5).formula_prefix_share() == pytest.approx(0.25)
    assert spec("fixed:100", prefix_share=1.0, prefix_words=80).formula_prefix_share() == pytest.approx(0.8)
    # a prefix longer than the prompt: prompts grow to prefix + 1 word
    long = spec("fixed:10", prefix_share=1.0, prefix_words=30)
    assert long.mean_prompt_words() == 31
    assert long.formula_prefix_share() == pytest.approx(30 / 31)
    assert spec("fixed:8", prefix_share=0.5).to_dict()["prefix_words"] == 4


@pytest.mark.parametrize("kw", [{"prefix_share": 1.5}, {"prefix_count": 0}, {"prefix_words": 0}])
def test_bad_workload_specs(kw: dict[str, float]) -> None:
    with pytest.raises(WorkloadError):
        spec(**kw)


def test_poisson_arrivals_by_count_and_by_duration() -> None:
    arrivals = poisson_arrivals(20.0, random.Random(4), count=4000)
    assert len(arrivals) == 4000
    assert arrivals == sorted(arrivals)
    gaps = [b - a for a, b in zip([0.0, *arrivals], arrivals, strict=False)]
    assert statistics.fmean(gaps) == pytest.approx(1 / 20, rel=0.05)
    timed = poisson_arrivals(50.0, random.Random(4), duration_s=10.0)
    assert all(t <= 10.0 for t in timed)
    assert len(timed) == pytest.approx(500, rel=0.15)
    both = poisson_arrivals(50.0, random.Random(4), duration_s=10.0, count=7)
    assert len(both) == 7
    assert poisson_arrivals(5.0, random.Random(9), count=10) == poisson_arrivals(5.0, random.Random(9), count=10)


@pytest.mark.parametrize(("rate", "kw"), [(0.0, {"count": 3}), (2.0, {})])
def test_poisson_arrivals_need_a_rate_and_a_bound(rate: float, kw: dict[str, int]) -> None:
    with pytest.raises(WorkloadError):
        poisson_arrivals(rate, random.Random(0), **kw)
