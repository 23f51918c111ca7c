"""`bench factual`: is the served model right wherever its float32 reference is right?

    1. the reference (bench/factual/answers.py): the prepared model folder in float32 by transformers,
       greedy, over the 200 prompts of bench/factual/prompt_set.py; or read back from `--reference FILE` (the
       `reference.json` an earlier run wrote), or nothing more with `--reference-only`
    2. the served passes: the same prompts through `--url` (the gateway) at temperature 0, one pass per
       `--concurrency` level (1 then 8 by default: concurrent batches, and the second pass meets every
       prompt in the prefix cache), `x-spillover-residency: local_only` unless `--residency any`, so the
       answers are the local model's and not a cloud target's
    3. the replica's precision, CPU class and numerics state (`GET /v1/spillover/cluster`)
    4. the report (bench/factual/report.py): accuracy of each run, per topic, the phrasing spread, and
       the acceptance — every prompt the reference answers right is right in every served pass and no
       served answer degenerates — with each violation listed

Exit code 0 when the acceptance holds (or `--reference-only` wrote the reference), 1 when it does not or
the URL is unreachable, 2 on bad input (flags, a reference file of another set, a model not served).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench.calibrate.report import environment, progress_printer
from bench.factual.answers import reference_answers, replica_view, served_pass
from bench.factual.check import Answer, Violation, shared_loops, violations
from bench.factual.prompt_set import PROMPTS, FactualPrompt
from bench.load.loadgen import BadBaseUrl, check_base_url, make_client
from bench.load.target import BenchError, preflight
from router import headers as hdr

REFERENCE_FILE = "reference.json"
DEFAULT_MODEL = "smollm2-135m-instruct"


class FactualError(BenchError):
    pass


@dataclass(frozen=True)
class FactualOptions:
    url: str | None = None  # the gateway's OpenAI base, .../v1 (not needed with reference_only)
    model: str = DEFAULT_MODEL
    model_dir: str | None = None  # default: the prepared catalog folder of `model`
    concurrency: tuple[int, ...] = (1, 8)
    max_tokens: int = 32
    residency: str = "local_only"  # x-spillover-residency of served requests; "any": not sent
    reference: str | None = None  # a reference.json to reuse instead of running transformers
    reference_only: bool = False
    limit: int | None = None  # only the first N prompts of the set (a quick check; the acceptance is over those)
    request_timeout_s: float = 120.0
    api_key: str | None = field(default=None, repr=False)
    out_dir: str | None = None
    progress: bool = True


@dataclass(frozen=True)
class FactualRun:
    options: FactualOptions
    started_at: str
    prompts: tuple[FactualPrompt, ...]
    reference: dict[str, Answer]
    reference_info: dict[str, Any]
    passes: dict[str, dict[str, Answer]]  # "c=1" -> answers
    replicas: dict[str, Any]
    environment: dict[str, Any]

    @property
    def violations(self) -> list[Violation]:
        return violations(self.prompts, self.reference, self.passes)

    @property
    def accepted(self) -> bool:
        return bool(self.passes) and not self.violations

    def to_dict(self) -> dict[str, Any]:
        from bench.factual.check import phrasing_spread, summarize_run

        opts = {k: v for k, v in asdict(self.options).items() if k != "api_key"}
        runs = {"reference": self.reference, **self.passes}
        return {
            "started_at": self.started_at,
            "options": opts,
            "prompts": [p.to_dict() for p in self.prompts],
            "reference_info": self.reference_info,
            "summaries": {label: summarize_run(label, self.prompts, a).to_dict() for label, a in runs.items()},
            "phrasing_spread": {label: phrasing_spread(self.prompts, a).to_dict() for label, a in runs.items()},
            "reference": {k: a.to_dict() for k, a in self.reference.items()},
            "passes": {label: {k: a.to_dict() for k, a in answers.items()} for label, answers in self.passes.items()},
            "replicas": self.replicas,
            "acceptance": {
                "passed": self.accepted,
                "violations": [v.to_dict() for v in self.violations],
                "shared_loops": [list(pair) for pair in shared_loops(self.prompts, self.reference, self.passes)],
            },
            "environment": self.environment,
        }


@dataclass(frozen=True)
class FactualOutcome:
    run: FactualRun
    paths: dict[str, Path]

    @property
    def exit_code(self) -> int:
        if self.run.options.reference_only:
            return 0
        return 0 if self.run.accepted else 1


def load_reference(path: Path, prompts: tuple[FactualPrompt, ...]) -> tuple[dict[str, Answer], dict[str, Any]]:
    """A reference.json written by an earlier run; refused (exit 2) when it lacks a prompt of `prompts` or
    asked it another way (a file of another version of the set)."""
    try:
        data = json.loads(path.read_text())
        answers = {k: Answer.from_dict(v) for k, v in data["answers"].items()}
        info = dict(data.get("info") or {})
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise FactualError(f"--reference {path}: not a reference file of bench factual ({exc})", 2) from None
    questions = data.get("questions") or {}
    if any(questions.get(p.id) != p.question or p.id not in answers for p in prompts):
        raise FactualError(f"--reference {path}: written for another factual set; run the reference again", 2)
    return {p.id: answers[p.id] for p in prompts}, {**info, "read_from": str(path)}


def write_reference(
    path: Path, answers: Mapping[str, Answer], info: dict[str, Any], prompts: tuple[FactualPrompt, ...]
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "info": info,
        "questions": {p.id: p.question for p in prompts},
        "answers": {k: a.to_dict() for k, a in answers.items()},
    }
    path.write_text(json.dumps(data, indent=1) + "\n")


def _out_dir(options: FactualOptions, started: datetime) -> Path:
    if options.out_dir:
        return Path(options.out_dir)
    return Path("bench/results") / f"factual-{options.model}-{started:%Y%m%d-%H%M%S}"


def check_options(options: FactualOptions) -> str | None:
    """The checked base URL (None with reference_only); raises FactualError (exit 2)."""
    problems = []
    if not options.concurrency or any(c < 1 for c in options.concurrency):
        problems.append("concurrency levels must be >= 1")
    if options.max_tokens < 1:
        problems.append("max_tokens must be >= 1")
    if options.limit is not None and not 1 <= options.limit <= len(PROMPTS):
        problems.append(f"limit must be in [1, {len(PROMPTS)}]")
    if options.reference_only and options.reference:
        problems.append("--reference-only computes the reference; --reference reads one: give one of them")
    if not options.reference_only and not options.url:
        problems.append("--url is needed (or --reference-only)")
    if problems:
        raise FactualError("; ".join(problems), 2)
    if options.reference_only:
        return None
    try:
        return check_base_url(options.url or "")
    except BadBaseUrl as exc:
        raise FactualError(str(exc), 2) from None


def run_factual(
    options: FactualOptions,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    reference_fn: Callable[..., tuple[dict[str, Answer], dict[str, Any]]] = reference_answers,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> FactualOutcome:
    """The whole command (module docstring); `transport` and `reference_fn` are for tests."""
    from bench.factual.report import write_factual_report

    url = check_options(options)
    say = progress_printer(options.progress)
    started = now()
    out = _out_dir(options, started)
    prompts = PROMPTS[: options.limit] if options.limit else PROMPTS
    if options.reference:
        reference, info = load_reference(Path(options.reference), prompts)
        say(f"reference: {len(reference)} answers read from {options.reference}")
    else:
        folder = Path(options.model_dir) if options.model_dir else _catalog_dir(options.model)
        say(f"reference: float32 transformers on {folder}, {len(prompts)} prompts ...")
        reference, info = reference_fn(folder, prompts, options.max_tokens, say)
        write_reference(out / REFERENCE_FILE, reference, info, prompts)
    passes: dict[str, dict[str, Answer]] = {}
    replicas: dict[str, Any] = {"error": "not asked (--reference-only)", "replicas": []}
    if url is not None:
        passes, replicas = asyncio.run(_served(options, prompts, url, transport, say))
    run = FactualRun(
        options=options,
        started_at=started.isoformat(timespec="seconds"),
        prompts=prompts,
        reference=reference,
        reference_info=info,
        passes=passes,
        replicas=replicas,
        environment={**environment(), **({"engine": engine} if (engine := engine_in(replicas)) else {})},
    )
    return FactualOutcome(run, write_factual_report(run, out))


def engine_in(replicas: Mapping[str, Any]) -> dict[str, Any] | None:
    """The precision and CPU class of the first replica that says (the report's environment section)."""
    for row in replicas.get("replicas") or []:
        if row.get("precision"):
            return {"precision": row["precision"], "cpu_class": row.get("cpu_class")}
    return None


def _catalog_dir(model: str) -> Path:
    from cluster.models import CATALOG, is_prepared, model_dir

    if model not in CATALOG:
        raise FactualError(f"{model!r} is not a catalog model: give its folder with --model-dir", 2)
    if not is_prepared(model):
        raise FactualError(f"{model} is not prepared: run `spillover models prepare {model}`", 2)
    return model_dir(model)


async def _served(
    options: FactualOptions,
    prompts: tuple[FactualPrompt, ...],
    url: str,
    transport: httpx.AsyncBaseTransport | None,
    say: Callable[[str], None],
) -> tuple[dict[str, dict[str, Answer]], dict[str, Any]]:
    headers = {} if options.residency == "any" else {hdr.RESIDENCY: options.residency}
    client = make_client(url, transport=transport, api_key=options.api_key, read_timeout_s=options.request_timeout_s)
    passes: dict[str, dict[str, Answer]] = {}
    try:
        await preflight(client, url, options.model, FactualError)
        base = url.removesuffix("/v1")
        replicas = await replica_view(client, base, options.model)
        for row in replicas["replicas"]:
            say(
                f"replica {row.get('replica_id')}: precision {row.get('precision')}, cpu {row.get('cpu_class')}, "
                f"numerics {row.get('numerics')}, fault {row.get('fault')}"
            )
        for level in options.concurrency:
            label = f"c={level}"
            say(f"[served {label}] {len(prompts)} prompts through {url} ...")
            passes[label] = await served_pass(
                client,
                options.model,
                prompts,
                concurrency=level,
                max_tokens=options.max_tokens,
                headers=headers,
                request_timeout_s=options.request_timeout_s,
                progress=say,
                label=f"served {label}",
            )
        after = await replica_view(client, base, options.model)
        replicas = {**replicas, "after": after}
    finally:
        await client.aclose()
    return passes, replicas


def summary_lines(outcome: FactualOutcome) -> list[str]:
    from bench.factual.check import summarize_run

    run = outcome.run
    ref = summarize_run("reference", run.prompts, run.reference)
    lines = [f"factual: reference float32 {ref.right}/{ref.prompts} right ({ref.accuracy:.0%})"]
    for label, answers in run.passes.items():
        s = summarize_run(label, run.prompts, answers)
        lines.append(
            f"  served {label}: {s.right}/{s.prompts} right ({s.accuracy:.0%}), {s.degenerate} degenerate, "
            f"{s.errors} without answer"
        )
    if not run.options.reference_only:
        found = run.violations
        verdict = "PASSED" if not found else f"FAILED: {len(found)} violation(s)"
        lines.append(f"  acceptance (right wherever the reference is right, none degenerate): {verdict}")
        lines += [f"    {v.run} {v.id} {v.kind}: {(v.served or v.detail)[:80]!r}" for v in found[:20]]
    lines.append(f"  report: {outcome.paths['report.md']}")
    return lines
