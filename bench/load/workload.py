"""Seedable load-test workloads: request bodies and arrival schedules.

Lengths are counted in words; the prompt text is built from `WORDS`, short common English words
that are one token each in the usual BPE vocabularies (Llama, Qwen, SmolLM2), so a word count is
close to a token count (the measured `usage.prompt_tokens` goes into the results to check it).

Length distributions (`LengthDist.parse`):

    fixed:64           always 64
    uniform:32-128     uniform integer in [32, 128]
    lognormal:256      lognormal with mean 256 and sigma 0.5 (of the log), clamped to [1, 8 × mean]
    lognormal:256,0.8  ... sigma 0.8 (above sigma ≈ 1 the clamp lowers the mean noticeably)

Shared prefixes: a fraction `prefix_share` of the requests start with one of `prefix_count` (K)
system prompts of `prefix_words` words (default: half the mean prompt), so prefix caching shows.
Such a request's prompt is the system prompt plus max(1, length − prefix_words) unique words.
For the capacity formula (one prefix held once, `prefix_share` = fraction of the prompt shared)
this is approximately `WorkloadSpec.formula_prefix_share()` = share × prefix_words / mean prompt.

Schedules: closed loop (N workers, each sends its next request when the previous one ends: see
`bench.load.loadgen`) or open loop (`poisson_arrivals`: exponential gaps at rate λ, for a duration or a
count). Everything random comes from the `random.Random` passed in: one seed, one workload.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from typing import Any, Literal

WORDS: tuple[str, ...] = tuple(
    """
    the of and to in is it you that he was for on are as with his they at be this have from or one had by
    word but not what all were we when your can said there use an each which she do how their if will up
    other about out many then them these so some her would make like him into time has look two more write
    go see number no way could people my than first water been call who oil its now find long down day did
    get come made may part over new sound take only little work know place year live me back give most very
    after thing our just name good sentence man think say great where help through much before line right too
    mean old any same tell boy follow came want show also around form three small set put end does another
    well large must big even such because turn here why ask went men read need land different home us move
    try kind hand picture again change off play spell air away animal house point page letter mother answer
    found study still learn should world high every near add food between own below country plant last school
    father keep tree never start city earth eye light thought head under story saw left few while along might
    close something seem next hard open example begin life always those both paper together got group often run
    """.split()
)

DistKind = Literal["fixed", "uniform", "lognormal"]
_SPEC = re.compile(r"^(fixed|uniform|lognormal):(.+)$")
DEFAULT_SIGMA = 0.5
LOGNORMAL_CAP = 8


class WorkloadError(ValueError):
    """A workload spec that cannot be used; the message says what the right form is."""


@dataclass(frozen=True)
class LengthDist:
    kind: DistKind
    low: int
    high: int = 0
    sigma: float = DEFAULT_SIGMA

    @classmethod
    def parse(cls, text: str) -> LengthDist:
        """ "fixed:64", "uniform:32-128", "lognormal:256" or "lognormal:256,0.8" (mean, sigma)."""
        match = _SPEC.match(text.strip())
        try:
            if match is None:
                raise ValueError
            kind, arg = match.group(1), match.group(2)
            if kind == "fixed":
                dist = cls("fixed", int(arg), int(arg))
            elif kind == "uniform":
                low, high = (int(v) for v in arg.split("-"))
                dist = cls("uniform", low, high)
            else:
                mean, _, sigma = arg.partition(",")
                dist = cls("lognormal", int(mean), int(mean), float(sigma) if sigma else DEFAULT_SIGMA)
        except ValueError:
            raise WorkloadError(
                f"not a length distribution: {text!r}; use fixed:64, uniform:32-128, lognormal:256 "
                "or lognormal:256,0.8 (mean, sigma)"
            ) from None
        dist.check()
        return dist

    def check(self) -> None:
        if self.low < 1 or self.high < self.low:
            raise WorkloadError(f"{self}: lengths must be >= 1 and low <= high")
        if self.kind == "lognormal" and not 0 < self.sigma <= 3:
            raise WorkloadError(f"{self}: lognormal sigma must be in (0, 3]")

    def __str__(self) -> str:
        if self.kind == "fixed":
            return f"fixed:{self.low}"
        if self.kind == "uniform":
            return f"uniform:{self.low}-{self.high}"
        return f"lognormal:{self.low},{self.sigma:g}"

    @property
    def mean(self) -> float:
        return (self.low + self.high) / 2 if self.kind == "uniform" else float(self.low)

    @property
    def bounds(self) -> tuple[int, int]:
        """Smallest and largest value `sample` can return."""
        return (1, LOGNORMAL_CAP * self.low) if self.kind == "lognormal" else (self.low, self.high)

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            return self.low
        if self.kind == "uniform":
            return rng.randint(self.low, self.high)
        mu = math.log(self.low) - self.sigma**2 / 2  # so that the mean is `low`
        low, high = self.bounds
        return min(high, max(low, round(rng.lognormvariate(mu, self.sigma))))


@dataclass(frozen=True)
class WorkloadSpec:
    prompt: LengthDist
    output: LengthDist
    prefix_share: float = 0.0
    prefix_count: int = 4
    prefix_words: int | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.prefix_share <= 1:
            raise WorkloadError(f"prefix share must be in [0, 1], got {self.prefix_share}")
        if self.prefix_count < 1:
            raise WorkloadError(f"prefix count must be >= 1, got {self.prefix_count}")
        if self.prefix_words is not None and self.prefix_words < 1:
            raise WorkloadError(f"prefix words must be >= 1, got {self.prefix_words}")

    @property
    def system_prompt_words(self) -> int:
        return self.prefix_words if self.prefix_words is not None else max(1, round(self.prompt.mean / 2))

    def formula_prefix_share(self) -> float:
        """The capacity formula's prefix_share: the expected fraction of a prompt that is a shared prefix."""
        if self.prefix_share == 0:
            return 0.0
        share = self.prefix_share * self.system_prompt_words / self.mean_prompt_words()
        return min(share, 0.99)

    def mean_prompt_words(self) -> float:
        """Expected prompt length, counting the system prompt of prefixed requests."""
        unique = max(1.0, self.prompt.mean - self.system_prompt_words)
        return (1 - self.prefix_share) * self.prompt.mean + self.prefix_share * (self.system_prompt_words + unique)

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt": str(self.prompt),
            "output": str(self.output),
            "prefix_share": self.prefix_share,
            "prefix_count": self.prefix_count,
            "prefix_words": self.system_prompt_words,
            "formula_prefix_share": self.formula_prefix_share(),
        }


@dataclass(frozen=True)
class WorkItem:
    """One request to send: chat messages and max_tokens, with what went into them."""

    index: int
    messages: tuple[dict[str, str], ...]
    max_tokens: int
    prompt_words: int
    prefix_id: int | None


def words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


def system_prompts(spec: WorkloadSpec, rng: random.Random) -> list[str]:
    """The K shared system prompts."""
    return [words(rng, spec.system_prompt_words) for _ in range(spec.prefix_count)]


class RequestFactory:
    """Draws requests of one workload: the system prompts are drawn once, at creation, so every
    batch (every load level) shares them; indices continue across batches.
    The same spec and seed give the same sequence of requests."""

    def __init__(self, spec: WorkloadSpec, rng: random.Random) -> None:
        self.spec = spec
        self._rng = rng
        self.prefixes = system_prompts(spec, rng) if spec.prefix_share > 0 else []
        self._next_index = 0

    def take(self, count: int) -> list[WorkItem]:
        items = [self._one(self._next_index + i) for i in range(count)]
        self._next_index += count
        return items

    def _one(self, index: int) -> WorkItem:
        rng, spec = self._rng, self.spec
        length = spec.prompt.sample(rng)
        max_tokens = spec.output.sample(rng)
        prefix_id: int | None = None
        messages: list[dict[str, str]] = []
        if self.prefixes and rng.random() < spec.prefix_share:
            prefix_id = rng.randrange(len(self.prefixes))
            messages.append({"role": "system", "content": self.prefixes[prefix_id]})
            length = max(1, length - spec.system_prompt_words)
        messages.append({"role": "user", "content": words(rng, length)})
        total = sum(len(m["content"].split()) for m in messages)
        return WorkItem(index, tuple(messages), max_tokens, total, prefix_id)


def poisson_arrivals(
    rate_per_s: float, rng: random.Random, *, duration_s: float | None = None, count: int | None = None
) -> list[float]:
    """Arrival offsets (s from the start) of a Poisson process at `rate_per_s`: exponential gaps,
    until `duration_s` has passed or `count` arrivals were drawn (whichever first; one is needed)."""
    if rate_per_s <= 0:
        raise WorkloadError(f"arrival rate must be > 0 per second, got {rate_per_s}")
    if duration_s is None and count is None:
        raise WorkloadError("open-loop arrivals need a duration or a count")
    arrivals: list[float] = []
    t = 0.0
    while count is None or len(arrivals) < count:
        t += rng.expovariate(rate_per_s)
        if duration_s is not None and t > duration_s:
            break
        arrivals.append(t)
    return arrivals
