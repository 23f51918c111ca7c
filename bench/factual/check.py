"""What `bench factual` judges, pure: one answer (right? degenerate?), one run's accuracy, and the
acceptance of a served run against the float32 reference.

    right        the prompt's regular expression matches the answer (bench/factual/prompt_set.py)
    degenerate   the answer ends in a repeated n-gram loop (`router.output.degenerate.loop_in`): what a wrong
                 kernel or dtype produces at temperature 0; judged on every answer, cut or not
    acceptance   every prompt the reference answers right is answered right in every served pass, and
                 no served answer degenerates; each exception is a `Violation`:
                     wrong        the reference was right, the served answer is not
                     no_answer    the reference was right, the served request got no answer (its error)
                     degenerate   a served answer that loops where the reference does not, whatever else
                                  the reference said
                 A served loop on a prompt where the float32 reference loops too is the model's, not the
                 engine's (SmolLM2-135M loops on "What's the capital of France?" in float32 by
                 transformers): `shared_loops` lists those, the report shows them, they are no violation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from bench.factual.prompt_set import FactualPrompt
from router.output.degenerate import loop_in


@dataclass(frozen=True)
class Answer:
    """One prompt's answer in one run (the reference or a served pass)."""

    id: str
    text: str | None  # None: no answer (see `error`)
    right: bool = False
    loop: str | None = None  # why the answer is degenerate, else None
    error: str | None = None
    finish_reason: str | None = None
    route: str | None = None  # x-spillover-route of a served answer
    target: str | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    latency_s: float | None = None

    @property
    def degenerate(self) -> bool:
        return self.loop is not None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Answer:
        fields = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in fields})


def graded(prompt: FactualPrompt, text: str | None, *, error: str | None = None, **facts: Any) -> Answer:
    """The answer to `prompt`, judged: right when its pattern matches, degenerate when it loops."""
    if text is None:
        return Answer(prompt.id, None, error=error or "no_answer", **facts)
    return Answer(prompt.id, text, right=prompt.is_right(text), loop=loop_in(text), error=error, **facts)


@dataclass(frozen=True)
class RunSummary:
    label: str
    prompts: int
    answered: int
    right: int
    degenerate: int
    errors: int
    routes: dict[str, int]
    prompt_tokens: int
    cached_tokens: int

    @property
    def accuracy(self) -> float:
        return self.right / self.prompts if self.prompts else 0.0

    @property
    def cached_share(self) -> float | None:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "accuracy": self.accuracy, "cached_share": self.cached_share}


def summarize_run(label: str, prompts: Sequence[FactualPrompt], answers: Mapping[str, Answer]) -> RunSummary:
    """Accuracy over the whole set: a prompt without an answer counts as not right."""
    given = [answers[p.id] for p in prompts if p.id in answers]
    routes: dict[str, int] = {}
    for a in given:
        if a.text is not None:
            routes[a.route or "unknown"] = routes.get(a.route or "unknown", 0) + 1
    return RunSummary(
        label=label,
        prompts=len(prompts),
        answered=sum(1 for a in given if a.text is not None),
        right=sum(1 for a in given if a.right),
        degenerate=sum(1 for a in given if a.degenerate),
        errors=len(prompts) - sum(1 for a in given if a.text is not None),
        routes=routes,
        prompt_tokens=sum(a.prompt_tokens or 0 for a in given if a.cached_tokens is not None),
        cached_tokens=sum(a.cached_tokens or 0 for a in given),
    )


@dataclass(frozen=True)
class Violation:
    run: str  # the served pass, e.g. "c=8"
    id: str
    kind: str  # wrong | no_answer | degenerate
    question: str
    expected: str
    reference: str | None
    served: str | None
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def violations(
    prompts: Sequence[FactualPrompt],
    reference: Mapping[str, Answer],
    served: Mapping[str, Mapping[str, Answer]],
) -> list[Violation]:
    """Every breach of the acceptance rule (module docstring), per served pass in the order given."""
    found = []
    for run, answers in served.items():
        for prompt in prompts:
            ref = reference.get(prompt.id)
            got = answers.get(prompt.id)
            kinds: list[tuple[str, str]] = []
            if got is not None and got.degenerate and not (ref is not None and ref.degenerate):
                kinds.append(("degenerate", got.loop or ""))
            if ref is not None and ref.right:
                if got is None or got.text is None:
                    kinds.append(("no_answer", (got.error if got else None) or "not sent"))
                elif not got.right:
                    kinds.append(("wrong", f"does not match /{prompt.pattern}/i"))
            found += [
                Violation(
                    run,
                    prompt.id,
                    kind,
                    prompt.question,
                    prompt.answer,
                    ref.text if ref else None,
                    got.text if got else None,
                    detail,
                )
                for kind, detail in kinds
            ]
    return found


def shared_loops(
    prompts: Sequence[FactualPrompt],
    reference: Mapping[str, Answer],
    served: Mapping[str, Mapping[str, Answer]],
) -> list[tuple[str, str]]:
    """(pass, prompt id) of every served loop on a prompt where the reference loops too: the model's own."""
    found = []
    for run, answers in served.items():
        for prompt in prompts:
            ref, got = reference.get(prompt.id), answers.get(prompt.id)
            if ref is not None and ref.degenerate and got is not None and got.degenerate:
                found.append((run, prompt.id))
    return found


@dataclass(frozen=True)
class PhrasingSpread:
    """Of the facts asked in several phrasings: how many a run gets right in all, some or none."""

    all: int
    some: int
    none: int

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def phrasing_spread(prompts: Sequence[FactualPrompt], answers: Mapping[str, Answer]) -> PhrasingSpread:
    by_fact: dict[str, list[bool]] = {}
    for p in prompts:
        answer = answers.get(p.id)
        by_fact.setdefault(f"{p.topic}-{p.fact}", []).append(bool(answer and answer.right))
    marks = [v for v in by_fact.values() if len(v) > 1]
    return PhrasingSpread(
        all=sum(1 for v in marks if all(v)),
        some=sum(1 for v in marks if any(v) and not all(v)),
        none=sum(1 for v in marks if not any(v)),
    )
