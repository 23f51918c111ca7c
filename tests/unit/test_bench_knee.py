"""bench.calibrate.knee: knees of synthetic sweeps with known answers, and the comparison with the formula."""

from __future__ import annotations

import pytest

from bench.calibrate.knee import LoadPoint, binding_bound, compare_with_formula, find_knee

LEVELS = (1, 2, 4, 8, 16)


def curve(throughput: list[float], p95: list[float | None], errors: list[float] | None = None) -> list[LoadPoint]:
    errors = errors or [0.0] * len(throughput)
    return [LoadPoint(c, t, p, e) for c, t, p, e in zip(LEVELS, throughput, p95, errors, strict=False)]


CASES = [
    pytest.param(
        curve([10, 19, 35, 40, 40.5], [1.0, 1.1, 1.3, 2.0, 6.0]), 5.0, 8, "latency", "p95 6 s > SLO 5 s",
        id="plateau-then-latency-breaks",
    ),
    pytest.param(
        curve([10, 20, 38, 40, 30], [1.0, 1.0, 1.2, 1.5, 2.0]), 5.0, 8, "throughput", "< 95% of the plateau 40",
        id="throughput-collapses",
    ),
    pytest.param(
        curve([10, 20, 38, 40, 41], [1.0, 1.0, 1.2, 1.5, 1.6], [0, 0, 0, 0.005, 0.3]), 5.0, 8, "errors",
        "error rate 30.0% > 1.0%", id="errors-at-16",
    ),
    pytest.param(
        curve([10, 20, 38, 40, 41], [1.0, 1.0, 1.2, 1.5, 1.6]), 5.0, 16, "sweep_end", "highest level tested",
        id="never-breaks",
    ),
    pytest.param(
        curve([10, 20, 38, 40, 41], [6.0, 7.0, 8.0, 9.0, 10.0]), 5.0, None, "none",
        "no level met the SLO: the lowest p95 was 6 s at concurrency 1", id="slo-never-met",
    ),
    pytest.param(
        curve([10, 20], [1.0, 1.0], [0.5, 0.2]), 5.0, None, "none", "every level had errors", id="always-errors",
    ),
    pytest.param(
        curve([10, 20, 0], [1.0, 2.0, None], [0, 0, 1.0]), 5.0, 2, "latency", "no request succeeded at concurrency 4",
        id="no-success-at-4",
    ),
    pytest.param(
        # a fast 429 flood at 8 has no successes' worth of throughput: it does not set the plateau
        curve([10, 20, 38, 55], [1.0, 1.0, 1.1, 1.0], [0, 0, 0, 0.6]), 5.0, 4, "errors", "error rate 60.0%",
        id="plateau-ignores-error-levels",
    ),
    pytest.param(
        # throughput still grows past the SLO: the SLO binds, the plateau is the best within it
        curve([10, 20, 38, 55], [1.0, 2.0, 4.0, 6.0]), 5.0, 4, "latency", "p95 6 s > SLO 5 s", id="slo-before-plateau",
    ),
    pytest.param(
        curve([10, 20, 38, 60], [1.0, 1.0, 1.0, 1.0], [0, 0.5, 0, 0]), 5.0, 8, "sweep_end", "highest level",
        id="non-monotone-largest-wins",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("points", "slo", "knee", "bound", "says"), CASES)
def test_find_knee(points: list[LoadPoint], slo: float, knee: int | None, bound: str, says: str) -> None:
    found = find_knee(points, slo)
    assert found.concurrency == knee
    assert found.bound == bound
    assert says in found.explanation
    if knee is not None:
        assert found.point is not None and found.point.concurrency == knee


def test_knee_ignores_point_order_and_reports_plateau() -> None:
    points = curve([10, 19, 35, 40, 40.5], [1.0, 1.1, 1.3, 2.0, 6.0])
    knee = find_knee(list(reversed(points)), 5.0)
    assert knee.concurrency == 8
    assert knee.plateau_rps == 40  # 16 breaks the SLO: it does not set the plateau
    assert knee.to_dict()["bound"] == "latency"


def test_knee_needs_points_and_sane_arguments() -> None:
    assert find_knee([], 5.0).concurrency is None
    with pytest.raises(ValueError, match="SLO"):
        find_knee([LoadPoint(1, 1.0, 1.0)], 0)
    with pytest.raises(ValueError, match="plateau_fraction"):
        find_knee([LoadPoint(1, 1.0, 1.0)], 1.0, plateau_fraction=1.5)


@pytest.mark.parametrize(
    ("knee", "predicted", "diff", "exceeds", "says"),
    [
        (40, 40, 0.0, False, "within 15%"),
        (23, 20, 0.15, False, "within 15%"),  # exactly 15% is still within
        (10, 8, 0.25, True, "25% above"),
        (3, 10, -0.7, True, "70% below"),
        (None, 10, None, False, "no knee was measured"),
        (5, None, None, False, "the formula gave no admission limit"),
        (5, 0, None, False, "the formula gave no admission limit"),
    ],
)
def test_compare_with_formula(knee: int | None, predicted: int | None, diff: float | None, exceeds: bool, says: str):
    cmp = compare_with_formula(knee, predicted)
    assert cmp.exceeds is exceeds
    assert (cmp.relative_diff is None) == (diff is None)
    if diff is not None:
        assert cmp.relative_diff == pytest.approx(diff)
    assert says in cmp.sentence


def test_comparison_sentences_explain_the_direction() -> None:
    assert "compute/throughput-bound" in compare_with_formula(3, 10).sentence
    assert "more than the formula's worst case" in compare_with_formula(20, 10).sentence
    assert "raise the levels" in compare_with_formula(3, 10, knee_bound="sweep_end").sentence
    assert compare_with_formula(3, 10, tolerance=0.8).exceeds is False


@pytest.mark.parametrize(
    ("knee", "bound", "kv_limit", "expected"),
    [
        (8, "latency", 236, "compute/throughput"),
        (8, "latency", 6, "memory"),
        (8, "latency", 8, "memory"),
        (8, "sweep_end", 236, "undetermined"),
        (8, "sweep_end", 4, "memory"),
        (None, "none", 236, "undetermined"),
        (8, "latency", None, "undetermined"),
    ],
)
def test_binding_bound(knee: int | None, bound: str, kv_limit: int | None, expected: str) -> None:
    points = [LoadPoint(knee, 1.0, 1.0)] if knee else []
    found = find_knee(points, 5.0)
    found = found.__class__(knee, bound, "", 1.0, 5.0)  # type: ignore[arg-type]
    assert binding_bound(found, kv_limit) == expected
