"""Per-bucket quality (router/learning/quality.py): bucket keys, the Beta prior, bucket statistics, and the
quality scorer switching from the configured number to the learned one at `min_samples`."""

from __future__ import annotations

from typing import Any

import pytest

from router.learning.decision import Attempt, DecisionRecord
from router.learning.quality import QualityBook, beta_mean, bucket_key, contract_bucket, length_band
from router.percentile import percentile
from router.request.contract import derive_contract
from router.routing.capabilities import Registry
from router.routing.pipeline import run_pipeline
from router.routing.plugins import TargetState
from router.routing.policy import Policy
from tests.unit.replay_world import make_config

CONTRACT = {"scenario": "default", "language": "latin", "est_prompt_tokens": 10, "needs_tools": False, "level": "L2"}
BUCKET = "task=default|lang=latin|len=short|tools=0|risk=L2"


def record(
    *attempts: Attempt, chosen: str | None = "cloud:sim/m", contract: dict[str, Any] = CONTRACT
) -> DecisionRecord:
    return DecisionRecord("r", "v1", contract, (), ((), ()), 0.0, chosen=chosen, attempts=attempts)


@pytest.mark.parametrize(
    ("tokens", "band"),
    [(0, "short"), (255, "short"), (256, "medium"), (2047, "medium"), (2048, "long"), (16384, "xlong")],
)
def test_length_bands(tokens: int, band: str) -> None:
    assert length_band(tokens) == band


def test_bucket_key_is_the_same_from_a_contract_and_from_its_record() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "天气怎么样？请告诉我"}], "tools": []}
    contract = derive_contract(body, {"x-spillover-level": "L1"}, Policy())
    assert (
        contract_bucket(contract) == bucket_key(contract.to_dict()) == "task=default|lang=zh|len=short|tools=0|risk=L1"
    )
    assert bucket_key(CONTRACT) == BUCKET


def test_beta_prior_is_conservative() -> None:
    assert beta_mean(0.8, 10, 0, 0) == 0.8  # no evidence: the configured quality
    assert beta_mean(0.8, 10, 0, 2) == pytest.approx(8 / 12)  # two failures move it only part of the way
    assert beta_mean(0.8, 10, 0, 90) == pytest.approx(8 / 100)  # lots of evidence wins
    assert beta_mean(0.5, 0, 3, 1) == 0.75  # no prior: the observed rate


def test_bucket_statistics_from_attempts_and_feedback() -> None:
    book = QualityBook({"cloud:sim/m": 0.5, "local:m": 0.5}, min_samples=3, prior_strength=2)
    book.observe(record(Attempt("local:m", "error", 0.1), Attempt("cloud:sim/m", "ok", 0.4)))
    book.observe(record(Attempt("cloud:sim/m", "contract_violation", 0.2), Attempt("cloud:sim/m", "ok", 0.6)))
    book.observe(record(Attempt("cloud:sim/m", "skipped", 0.0), Attempt("cloud:sim/m", "ok", 1.0)))
    # 3 answers + 1 contract violation = 4 samples >= 3: Beta(1, 1) prior + 3 successes, 1 failure = 4/6,
    # but evidence only ever lowers the configured quality (0.5)
    assert book.estimate("cloud:sim/m", BUCKET) == pytest.approx(0.5)
    view = book.view()["targets"]
    cloud = view["cloud:sim/m"][BUCKET]
    assert (cloud["successes"], cloud["failures"], cloud["samples"]) == (3, 1, 4)
    assert cloud["contract_violation_rate"] == 0.25 and cloud["success_rate"] == 0.75
    assert (cloud["latency_p50_s"], cloud["latency_p95_s"]) == (0.6, 1.0)
    assert view["local:m"][BUCKET]["errors"] == 1 and view["local:m"][BUCKET]["samples"] == 0  # availability only
    assert book.feedback(record(Attempt("cloud:sim/m", "ok", 0.3)), success=False)
    assert not book.feedback(record(Attempt("cloud:sim/m", "error", 0.3), chosen=None), success=True)
    assert book.view()["targets"]["cloud:sim/m"][BUCKET]["feedback"] == 1


def test_evidence_lowers_the_configured_quality_but_never_raises_it() -> None:
    # a target that got the traffic must not outrank one whose bucket saw less, on accepted answers alone
    book = QualityBook({"cloud:sim/m": 0.5}, min_samples=3, prior_strength=2)
    book.observe(record(*(Attempt("cloud:sim/m", "ok", 0.2) for _ in range(10))))
    assert book.estimate("cloud:sim/m", BUCKET) == pytest.approx(0.5)
    book.observe(record(*(Attempt("cloud:sim/m", "contract_violation", 0.2) for _ in range(20))))
    assert book.estimate("cloud:sim/m", BUCKET) == pytest.approx(11 / 32)  # Beta(1, 1) + 10 ok, 20 violations


def test_estimate_only_after_min_samples() -> None:
    book = QualityBook({"cloud:sim/m": 0.9}, min_samples=5, prior_strength=10)
    for _ in range(4):
        book.feedback(record(Attempt("cloud:sim/m", "ok", 0.1)), success=False)
    assert book.estimate("cloud:sim/m", BUCKET) is None
    book.feedback(record(Attempt("cloud:sim/m", "ok", 0.1)), success=False)
    assert book.estimate("cloud:sim/m", BUCKET) == pytest.approx(9 / 15)
    assert book.estimates(["cloud:sim/m", "local:m"], BUCKET) == {"cloud:sim/m": pytest.approx(0.6)}


def test_buckets_and_latencies_are_bounded() -> None:
    book = QualityBook({}, max_buckets=3, latency_window=5)
    for i in range(10):
        book.observe(record(Attempt("local:m", "ok", float(i)), contract={**CONTRACT, "scenario": f"s{i}"}))
    assert sum(len(b) for b in book.view()["targets"].values()) == 3
    for i in range(50):
        book.observe(record(Attempt("local:m", "ok", float(i))))
    assert book.view()["targets"]["local:m"][BUCKET]["latency_p50_s"] == 47.0
    assert percentile([], 50) is None


def test_the_quality_scorer_uses_the_learned_number_in_the_ranking() -> None:
    config = make_config()
    registry = Registry.from_config(config.models, config.cloud.providers)
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"function": {"name": "f"}}]}
    contract = derive_contract(body, {}, config.policy)
    targets = registry.for_alias("m")
    configured = run_pipeline(contract, targets, {}, config.policy)
    assert configured.tiers[1] == ("cloud:sim/m", "cloud:sim2/m")  # same configured quality, sim is cheaper
    learned = {"cloud:sim/m": TargetState(quality=0.1), "cloud:sim2/m": TargetState(quality=0.95)}
    result = run_pipeline(contract, targets, learned, config.policy)
    assert result.tiers[1] == ("cloud:sim2/m", "cloud:sim/m")
    assert result.scores["cloud:sim2/m"].scores["quality"].raw == 0.95
