"""`bench factual`: the set (200 distinct prompts, every pattern compiles and matches its own answer), the
acceptance logic on hand-made answers, and the served mode end to end against a fake gateway.

The fake gateway (an in-process Starlette app behind `httpx.ASGITransport`) reproduces what the real one
does on the paths the command uses: `GET /v1/models`; `POST /v1/chat/completions` answering the OpenAI
`chat.completion` shape with `finish_reason` and vLLM's `usage.prompt_tokens_details.cached_tokens` (a
prompt seen before counts as cached, as vLLM's prefix cache does), `x-spillover-route` /
`x-spillover-target` on every answer and an OpenAI error body (429 `local_capacity_exhausted`) when it
refuses; and `GET /v1/spillover/cluster` with replicas in `ReplicaStats.to_dict` form (precision,
cpu_class, numerics, fault, notes). Its "model" answers from a script: right, wrong, or a greedy loop.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from bench.cli import build_parser
from bench.factual.check import Answer, graded, phrasing_spread, shared_loops, summarize_run, violations
from bench.factual.prompt_set import PROMPTS, SHARED_SYSTEM, TOPICS, FactualPrompt
from bench.factual.run import FactualError, FactualOptions, load_reference, run_factual, write_reference
from router import headers as hdr

MODEL = "smollm2-135m-instruct"
LOOP = "Paris, la femme, la femme, la femme, la femme, la femme, la femme, la femme"


# -- the set -------------------------------------------------------------------------------


def test_the_set_has_200_distinct_prompts_with_unique_ids() -> None:
    assert len(PROMPTS) == 200
    assert len({p.question for p in PROMPTS}) == 200
    assert len({json.dumps(p.messages()) for p in PROMPTS}) == 200
    assert len({p.id for p in PROMPTS}) == 200


@pytest.mark.parametrize("prompt", PROMPTS, ids=lambda p: p.id)
def test_each_pattern_compiles_and_matches_its_own_canonical_answer(prompt: FactualPrompt) -> None:
    re.compile(prompt.pattern, re.IGNORECASE)
    assert prompt.is_right(prompt.answer)
    assert prompt.is_right(f"The answer is {prompt.answer.upper()}.")  # case does not matter
    assert not prompt.is_right("I do not know.")


def test_facts_come_in_several_phrasings_and_capitals_in_four() -> None:
    by_fact: dict[str, list[FactualPrompt]] = {}
    for p in PROMPTS:
        by_fact.setdefault(f"{p.topic}-{p.fact}", []).append(p)
    assert all(len(group) >= 2 for group in by_fact.values())
    capitals = [g for key, g in by_fact.items() if key.startswith("capitals-")]
    assert len(capitals) == 20 and all(len(g) == 4 for g in capitals)
    france = {p.question for p in by_fact["capitals-france"]}
    assert france == {"What is the capital of France?", "What's the capital of France?",
                      "Name the capital city of France.", "France's capital is which city?"}  # fmt: skip
    assert len(TOPICS) >= 6


def test_a_share_of_the_prompts_starts_with_the_same_long_system_prompt() -> None:
    shared = [p for p in PROMPTS if p.system]
    assert 50 <= len(shared) <= 100
    assert all(p.messages()[0] == {"role": "system", "content": SHARED_SYSTEM} for p in shared)
    assert len(SHARED_SYSTEM.split()) >= 60  # several KV blocks of a common prefix
    assert all(p.messages() == [{"role": "user", "content": p.question}] for p in PROMPTS if not p.system)


def test_patterns_do_not_take_a_number_inside_another() -> None:
    two = next(p for p in PROMPTS if p.id == "arithmetic-1-plus-1-1")
    assert two.is_right("1 plus 1 is 2.") and not two.is_right("1 plus 1 is 12.")


# -- the judgement and the acceptance (pure) -------------------------------------------------


def _p(i: int) -> FactualPrompt:
    return FactualPrompt(f"t-{i}", "test", f"f{i // 2}", f"Question {i}?", r"\bparis\b", "Paris")


SMALL = tuple(_p(i) for i in range(4))


def test_an_answer_is_right_when_the_pattern_matches_and_degenerate_when_it_loops() -> None:
    prompt = _p(0)
    assert graded(prompt, "The capital is Paris.").right
    assert not graded(prompt, "The capital is Lyon.").right
    looped = graded(prompt, LOOP)
    assert looped.right and looped.degenerate and "repeated" in (looped.loop or "")
    missing = graded(prompt, None, error="timeout")
    assert missing.text is None and not missing.right and missing.error == "timeout"


def test_violations_wrong_missing_and_degenerate_where_the_reference_is_right() -> None:
    reference = {
        "t-0": graded(SMALL[0], "Paris."),
        "t-1": graded(SMALL[1], "Paris."),
        "t-2": graded(SMALL[2], "Paris."),
        "t-3": graded(SMALL[3], "Lyon."),  # the reference is wrong here: the served answer may be anything
    }
    served = {
        "c=1": {k: graded(p, "Paris it is.") for k, p in zip(reference, SMALL, strict=True)},
        "c=8": {
            "t-0": graded(SMALL[0], "Lyon."),  # wrong
            "t-1": graded(SMALL[1], None, error="local_capacity_exhausted"),  # no answer
            "t-2": graded(SMALL[2], LOOP),  # right but degenerate
            "t-3": graded(SMALL[3], LOOP),  # degenerate where the reference is wrong (no loop): a violation
        },
    }
    found = violations(SMALL, reference, served)
    assert [(v.run, v.id, v.kind) for v in found] == [
        ("c=8", "t-0", "wrong"),
        ("c=8", "t-1", "no_answer"),
        ("c=8", "t-2", "degenerate"),
        ("c=8", "t-3", "degenerate"),
    ]
    assert found[1].detail == "local_capacity_exhausted"
    assert found[0].reference == "Paris." and found[0].served == "Lyon."


def test_a_loop_the_float32_reference_shares_is_the_models_not_a_violation() -> None:
    reference = {"t-0": graded(SMALL[0], LOOP), "t-1": graded(SMALL[1], "Paris.")}
    served = {"c=1": {"t-0": graded(SMALL[0], LOOP), "t-1": graded(SMALL[1], LOOP)}}
    assert reference["t-0"].degenerate and reference["t-0"].right  # the loop starts with the right word
    assert [(v.id, v.kind) for v in violations(SMALL[:2], reference, served)] == [("t-1", "degenerate")]
    assert shared_loops(SMALL[:2], reference, served) == [("c=1", "t-0")]


def test_no_violation_when_served_is_right_wherever_the_reference_is_and_may_beat_it() -> None:
    reference = {"t-0": graded(SMALL[0], "Paris"), "t-1": graded(SMALL[1], "Rome")}
    served = {"c=1": {"t-0": graded(SMALL[0], "Paris"), "t-1": graded(SMALL[1], "Paris")}}
    assert violations(SMALL[:2], reference, served) == []
    unsent = violations(SMALL[:2], reference, {"c=1": {}})
    assert [(v.id, v.kind, v.detail) for v in unsent] == [("t-0", "no_answer", "not sent")]


def test_summary_accuracy_routes_and_cached_share() -> None:
    answers = {
        "t-0": graded(SMALL[0], "Paris", route="local", prompt_tokens=100, cached_tokens=80),
        "t-1": graded(SMALL[1], "Lyon", route="local", prompt_tokens=100, cached_tokens=0),
        "t-2": graded(SMALL[2], None, error="timeout"),
    }
    s = summarize_run("c=1", SMALL, answers)
    assert (s.prompts, s.answered, s.right, s.errors, s.degenerate) == (4, 2, 1, 2, 0)
    assert s.accuracy == 0.25 and s.cached_share == 0.4 and s.routes == {"local": 2}
    spread = phrasing_spread(SMALL, answers)  # facts f0 (t-0, t-1) and f1 (t-2, t-3)
    assert (spread.all, spread.some, spread.none) == (0, 1, 1)


def test_a_reference_file_round_trips_and_one_of_another_set_is_refused(tmp_path: Path) -> None:
    answers = {p.id: graded(p, p.answer) for p in PROMPTS}
    path = tmp_path / "reference.json"
    write_reference(path, answers, {"engine": "transformers x", "dtype": "float32"}, PROMPTS)
    read, info = load_reference(path, PROMPTS)
    assert read == answers and info["dtype"] == "float32" and info["read_from"] == str(path)
    first, _ = load_reference(path, PROMPTS[:10])  # a --limit run reads the answers it needs
    assert list(first) == [p.id for p in PROMPTS[:10]]
    reworded = (dataclasses.replace(PROMPTS[0], question="What, then, is the capital of France?"), *PROMPTS[1:])
    with pytest.raises(FactualError, match="another factual set") as caught:
        load_reference(path, reworded)
    assert caught.value.exit_code == 2
    (tmp_path / "bad.json").write_text("[]")
    with pytest.raises(FactualError, match="not a reference file"):
        load_reference(tmp_path / "bad.json", PROMPTS)


# -- the served mode against a fake gateway -------------------------------------------------


class FakeGateway:
    """See the module docstring: the gateway's OpenAI surface and cluster view, a scripted model."""

    def __init__(self, script: dict[str, str | None]) -> None:
        self.script = script  # question -> answer (None: refuse with 429)
        self.seen: list[dict[str, Any]] = []
        self.prompts_seen: set[str] = set()
        self.app = Starlette(
            routes=[
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/spillover/cluster", self.cluster, methods=["GET"]),
            ]
        )

    async def models(self, request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def cluster(self, request: Request) -> JSONResponse:
        replica = {
            "model": MODEL, "replica_id": "r1", "precision": "float32 eager", "cpu_class": "avx2",
            "numerics": "ok", "fault": None, "notes": ["bf16 not native on this CPU"], "stale": False,
        }  # fmt: skip
        return JSONResponse({"now": 0, "models": [MODEL], "replicas": [replica], "errors": []})

    async def chat(self, request: Request) -> JSONResponse:
        body = json.loads(await request.body())
        self.seen.append({"body": body, "headers": dict(request.headers)})
        question = body["messages"][-1]["content"]
        text = self.script.get(question, "I am not sure.")
        route = {hdr.ROUTE: "local", hdr.TARGET: f"local:{MODEL}"}
        if text is None:
            error = {"message": "no local capacity", "type": "rate_limit_error", "param": None,
                     "code": "local_capacity_exhausted"}  # fmt: skip
            return JSONResponse({"error": error}, status_code=429, headers=route)
        key = json.dumps(body["messages"])
        prompt_tokens = 20 + 3 * len(key.split())
        cached = prompt_tokens - 4 if key in self.prompts_seen else 0
        self.prompts_seen.add(key)
        finish = "length" if text == LOOP else "stop"
        return JSONResponse(
            {
                "id": "chatcmpl-1", "object": "chat.completion", "model": MODEL,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 8, "total_tokens": prompt_tokens + 8,
                          "prompt_tokens_details": {"cached_tokens": cached}},
            },
            headers=route,
        )  # fmt: skip


def _reference(right: set[str]) -> Any:
    """A stand-in for the transformers reference: right on the prompts of `right`, wrong elsewhere."""

    def run(folder: Path, prompts: Any, max_new_tokens: int, progress: Any) -> tuple[dict[str, Answer], dict]:
        answers = {p.id: graded(p, p.answer if p.id in right else "I do not know.") for p in prompts}
        return answers, {"engine": "transformers (test)", "dtype": "float32", "model_dir": str(folder)}

    return run


def _options(tmp_path: Path, **kw: Any) -> FactualOptions:
    defaults: dict[str, Any] = {"url": "http://127.0.0.1:8000/v1", "model_dir": str(tmp_path / "model"),
                                "out_dir": str(tmp_path / "out"), "progress": False}  # fmt: skip
    return FactualOptions(**{**defaults, **kw})


def test_served_passes_that_agree_with_the_reference_pass(tmp_path: Path) -> None:
    gateway = FakeGateway({p.question: f"It is {p.answer}." for p in PROMPTS})
    right = {p.id for p in PROMPTS[:150]}
    outcome = run_factual(_options(tmp_path), transport=httpx.ASGITransport(gateway.app),
                          reference_fn=_reference(right))  # fmt: skip
    assert outcome.exit_code == 0 and outcome.run.accepted
    assert len(gateway.seen) == 2 * 200  # one pass per level, 1 and 8
    first = gateway.seen[0]
    assert first["body"]["temperature"] == 0 and first["body"]["max_tokens"] == 32
    assert first["headers"][hdr.RESIDENCY] == "local_only"
    data = json.loads((tmp_path / "out/results.json").read_text())
    assert data["acceptance"] == {"passed": True, "violations": [], "shared_loops": []}
    assert data["summaries"]["reference"]["right"] == 150 and data["summaries"]["c=8"]["right"] == 200
    assert data["summaries"]["c=1"]["routes"] == {"local": 200}
    assert data["summaries"]["c=8"]["cached_share"] > 0.5  # the second pass meets every prompt again
    assert data["replicas"]["replicas"][0]["precision"] == "float32 eager"
    assert data["environment"]["cpu"]["class"]
    report = (tmp_path / "out/report.md").read_text()
    assert "**PASSED**" in report and "float32 eager" in report and "avx2" in report and "CPU:" in report
    assert data["environment"]["engine"] == {"precision": "float32 eager", "cpu_class": "avx2"}
    assert "Engine: float32 eager on avx2." in report
    assert (tmp_path / "out/reference.json").exists()


def test_a_wrong_a_refused_and_a_looping_answer_fail_the_acceptance(tmp_path: Path) -> None:
    script: dict[str, str | None] = {p.question: p.answer for p in PROMPTS}
    wrong, refused, looping = PROMPTS[0], PROMPTS[1], PROMPTS[2]
    script[wrong.question] = "Lyon."
    script[refused.question] = None
    script[looping.question] = LOOP
    gateway = FakeGateway(script)
    options = _options(tmp_path, concurrency=(4,), residency="any")
    outcome = run_factual(options, transport=httpx.ASGITransport(gateway.app),
                          reference_fn=_reference({p.id for p in PROMPTS}))  # fmt: skip
    assert outcome.exit_code == 1
    kinds = {(v.id, v.kind) for v in outcome.run.violations}
    assert kinds == {(wrong.id, "wrong"), (refused.id, "no_answer"), (looping.id, "degenerate")}
    assert all(hdr.RESIDENCY not in seen["headers"] for seen in gateway.seen)
    report = (tmp_path / "out/report.md").read_text()
    assert "**FAILED**: 3 violation(s)" in report and "local_capacity_exhausted" in report


def test_limit_takes_the_first_prompts_and_judges_only_those(tmp_path: Path) -> None:
    gateway = FakeGateway({p.question: p.answer for p in PROMPTS})
    options = _options(tmp_path, limit=12, concurrency=(3,))
    outcome = run_factual(options, transport=httpx.ASGITransport(gateway.app),
                          reference_fn=_reference({p.id for p in PROMPTS}))  # fmt: skip
    assert outcome.exit_code == 0 and len(gateway.seen) == 12 and len(outcome.run.reference) == 12


def test_reference_only_needs_no_url_and_a_reused_reference_skips_transformers(tmp_path: Path) -> None:
    options = _options(tmp_path, url=None, reference_only=True)
    outcome = run_factual(options, reference_fn=_reference({p.id for p in PROMPTS[:10]}))
    assert outcome.exit_code == 0 and outcome.run.passes == {}
    saved = tmp_path / "out/reference.json"

    def never(*args: Any) -> Any:
        raise AssertionError("the reference is read, not computed")

    gateway = FakeGateway({p.question: p.answer for p in PROMPTS})
    again = _options(tmp_path, reference=str(saved), out_dir=str(tmp_path / "again"), concurrency=(2,))
    reused = run_factual(again, transport=httpx.ASGITransport(gateway.app), reference_fn=never)
    assert reused.exit_code == 0 and reused.run.reference_info["read_from"] == str(saved)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"url": None}, "--url is needed"),
        ({"url": "ftp://x"}, "not an http"),
        ({"reference_only": True, "reference": "x.json"}, "give one of them"),
        ({"concurrency": ()}, "concurrency"),
        ({"limit": 201}, "limit must be"),
    ],
)
def test_bad_input_is_exit_2(tmp_path: Path, kw: dict[str, Any], message: str) -> None:
    with pytest.raises(FactualError, match=message) as caught:
        run_factual(_options(tmp_path, **kw), reference_fn=_reference(set()))
    assert caught.value.exit_code == 2


def test_an_unreachable_gateway_is_exit_1(tmp_path: Path) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(FactualError, match="cannot reach") as caught:
        run_factual(_options(tmp_path), transport=httpx.MockTransport(refuse), reference_fn=_reference(set()))
    assert caught.value.exit_code == 1


def test_the_command_line_has_factual_with_its_flags() -> None:
    args = build_parser().parse_args(["factual", "--url", "http://127.0.0.1:8000/v1", "--concurrency", "1,4"])
    assert args.concurrency == (1, 4) and args.max_tokens == 32 and args.residency == "local_only"
    assert args.func.__name__ == "cmd_factual"
