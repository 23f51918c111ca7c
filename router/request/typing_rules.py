"""Request typing: which scenario a request that declares none belongs to. Opt-in, narrows only.

    RequestTyper.type(text, tenant, request_id) -> Typed

1. A declared `x-business-scenario` always wins: the typer is not asked (serve_apps/learning/state.py).
2. Rules, in order: a rule matches when its tenants (if any) include the request's tenant and its
   regular expression (if any) is found in, or any of its keywords (if any) is a word of, the last
   user text; the first match types the request (`by: rule`, `rule`: its index).
3. Otherwise the classifier: the text's embedding (router/request/embedding.py) against each scenario's
   centroid (the normalised mean of its examples' embeddings); the most similar scenario types it
   (`by: classifier`) unless its cosine similarity is below `min_similarity`: then the default
   scenario (`by: fallback`). Every centroid's score is kept (`scores`).
4. Narrows only: a typed scenario looser than the policy's default scenario (a weaker level, wider
   residency, other target patterns, a higher cost ceiling or deadline, a lower quality floor) is
   not used: the default stands (`by: fallback`, `why` says which term).

The text is the last user message's text, cut to `MAX_TEXT` characters before any rule or embedding
sees it (bounded time for hostile prompts; operators' patterns should still avoid nested repeats).
Feedback labels add examples: `learn(request_id, scenario, owner)` adds the embedding remembered for
that request of that owner (the last `remember` requests; never their text) to that scenario's examples.
Learned examples never replace the configured ones, and they are kept per owner: a tenant's labels
move the centroids ITS requests are typed by, and only `shared` ones (an admin's; everyone's without
auth) move every tenant's. Each owner keeps at most `max_examples` learned examples per scenario.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from router.request.embedding import Embedder, Vector, cosine, normalised
from router.routing.policy import LEVELS, Policy, Scenario

MAX_TEXT = 4000
TypedBy = Literal["rule", "classifier", "fallback"]


@dataclass(frozen=True)
class Rule:
    scenario: str
    pattern: re.Pattern[str] | None = None
    keywords: frozenset[str] = frozenset()
    tenants: frozenset[str] | None = None

    def matches(self, text: str, words: frozenset[str], tenant: str | None) -> bool:
        if self.tenants is not None and tenant not in self.tenants:
            return False
        if self.pattern is None and not self.keywords:
            return True  # a tenant-only rule
        return (self.pattern is not None and self.pattern.search(text) is not None) or bool(self.keywords & words)


@dataclass(frozen=True)
class Typed:
    scenario: str | None  # None: the default scenario
    by: TypedBy
    score: float | None = None
    scores: Mapping[str, float] = field(default_factory=dict)
    rule: int | None = None
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "by": self.by,
            "score": self.score,
            "scores": dict(self.scores),
            "rule": self.rule,
            "why": self.why,
        }


def last_user_text(body: Mapping[str, Any]) -> str:
    """The last user message's text (string content or its text parts), or a completions prompt."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        prompt = body.get("prompt")
        return prompt[:MAX_TEXT] if isinstance(prompt, str) else ""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content[:MAX_TEXT]
            if isinstance(content, list):
                parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
                return " ".join(p for p in parts if isinstance(p, str))[:MAX_TEXT]
            return ""
    return ""


def looser_than(candidate: Scenario, default: Scenario) -> str | None:
    """Which term of `candidate` is looser than the default scenario's, or None when it only narrows."""
    if LEVELS.index(candidate.level) > LEVELS.index(default.level):
        return f"level {candidate.level} is weaker than {default.level}"
    d_res, c_res = default.residency, candidate.residency
    if d_res != "any" and c_res != "local_only":
        if d_res == "local_only" or c_res == "any" or not set(c_res) <= set(d_res):
            return f"residency {c_res} is wider than {d_res}"
    if default.allowed_targets != ["*"] and not set(candidate.allowed_targets) <= set(default.allowed_targets):
        return "allowed_targets are not among the default's"
    for term in ("max_cost_usd", "deadline_ms"):
        d, c = getattr(default, term), getattr(candidate, term)
        if d is not None and (c is None or c > d):
            return f"{term} {c} is above {d}"
    if candidate.quality_floor < default.quality_floor:
        return f"quality_floor {candidate.quality_floor} is below {default.quality_floor}"
    return None


SHARED: None = None  # the owner of examples that type every tenant's requests (configured, an admin's)


def _sum(vectors: Sequence[Vector]) -> Vector:
    return [sum(column) for column in zip(*vectors, strict=True)] if vectors else []


class CentroidClassifier:
    """Examples per (owner, scenario): the configured ones (fixed, owner SHARED), and the learned ones
    of each owner (the newest `max_examples`). A request of tenant T is scored against each scenario's
    centroid over the configured, the shared learned and T's own learned examples."""

    def __init__(self, embedder: Embedder, examples: Mapping[str, Sequence[str]], *, max_examples: int = 200) -> None:
        self.embedder = embedder
        self._max = max_examples
        self._configured: dict[str, list[Vector]] = {}
        self._learned: dict[tuple[str | None, str], list[Vector]] = {}
        self._sums: dict[tuple[str | None, str], tuple[Vector, int]] = {}  # (owner, scenario) -> (sum, count)
        for scenario, texts in examples.items():
            vectors = self.embedder.embed([t[:MAX_TEXT] for t in texts])[-max_examples:]
            if vectors:
                self._configured[scenario] = vectors
                self._sums[(SHARED, scenario)] = (_sum(vectors), len(vectors))

    def add(self, scenario: str, vectors: Iterable[Vector], owner: str | None = SHARED) -> None:
        """Learned examples of `owner` (SHARED: every tenant's); its newest `max_examples` kept."""
        key = (owner, scenario)
        learned = (self._learned.get(key, []) + list(vectors))[-self._max :]
        if not learned:
            return
        self._learned[key] = learned
        kept = self._configured.get(scenario, []) + learned if owner is SHARED else learned
        self._sums[key] = (_sum(kept), len(kept))

    def examples(self, scenario: str, owner: str | None = SHARED) -> int:
        """Examples a request of `owner` is typed by for `scenario` (SHARED: those of every tenant)."""
        shared = len(self._configured.get(scenario, [])) + len(self._learned.get((SHARED, scenario), []))
        return shared + (len(self._learned.get((owner, scenario), [])) if owner is not SHARED else 0)

    def centroid(self, scenario: str, owner: str | None = SHARED) -> Vector | None:
        parts = [self._sums.get((SHARED, scenario))]
        if owner is not SHARED:
            parts.append(self._sums.get((owner, scenario)))
        found = [p for p in parts if p is not None and p[1]]
        if not found:
            return None
        count = sum(n for _, n in found)
        return normalised([sum(column) / count for column in zip(*(v for v, _ in found), strict=True)])

    def scores(self, vector: Vector, owner: str | None = SHARED) -> dict[str, float]:
        scenarios = sorted({scenario for _, scenario in self._sums})
        centroids = {s: self.centroid(s, owner) for s in scenarios}
        return {s: round(cosine(vector, c), 4) for s, c in centroids.items() if c is not None}


class RequestTyper:
    def __init__(
        self,
        policy: Policy,
        rules: Sequence[Rule] = (),
        classifier: CentroidClassifier | None = None,
        *,
        min_similarity: float = 0.35,
        remember: int = 1000,
    ) -> None:
        self._policy = policy
        self._rules = tuple(rules)
        self.classifier = classifier
        self._min = min_similarity
        self._remember = remember
        self._vectors: OrderedDict[tuple[str, str], Vector] = OrderedDict()  # (owner, request id) -> embedding

    def _narrowed(self, typed: Typed) -> Typed:
        default_name = self._policy.default_name
        if typed.scenario is None or default_name is None:
            return typed
        why = looser_than(self._policy.scenarios[typed.scenario], self._policy.scenarios[default_name])
        if why is None:
            return typed
        return Typed(None, "fallback", typed.score, typed.scores, typed.rule, f"{typed.scenario} not used: {why}")

    def type(self, text: str, tenant: str | None = None, request_id: str | None = None) -> Typed:
        text = text[:MAX_TEXT]
        words = frozenset(w.lower() for w in re.findall(r"\w+", text))
        for index, rule in enumerate(self._rules):
            if rule.matches(text, words, tenant):
                return self._narrowed(Typed(rule.scenario, "rule", rule=index))
        if self.classifier is None:
            return Typed(None, "fallback", why="no rule matched")
        (vector,) = self.classifier.embedder.embed([text])
        if request_id is not None:
            self._vectors[(tenant or "", request_id)] = vector
            while len(self._vectors) > self._remember:
                self._vectors.popitem(last=False)
        scores = self.classifier.scores(vector, tenant or "")
        if not scores:
            return Typed(None, "fallback", why="no examples")
        best = max(scores, key=lambda s: (scores[s], s))
        if scores[best] < self._min:
            why = f"best similarity {scores[best]:.2f} ({best}) < {self._min:g}"
            return Typed(None, "fallback", scores[best], scores, why=why)
        return self._narrowed(Typed(best, "classifier", scores[best], scores))

    def learn(self, request_id: str, scenario: str, owner: str = "", *, shared: bool = True) -> bool:
        """Add the remembered embedding of `owner`'s `request_id` as an example of `scenario` (a policy
        scenario): for every tenant's requests when `shared`, else for `owner`'s only."""
        vector = self._vectors.get((owner, request_id))
        if vector is None or self.classifier is None or scenario not in self._policy.scenarios:
            return False
        self.classifier.add(scenario, [vector], SHARED if shared else owner)
        return True
