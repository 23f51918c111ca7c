"""The typing classifier on the labelled set (bench/request_typing/labelled_set.py) with two embedders: the shipped
`HashingEmbedder` and SmolLM2-135M-Instruct served by vLLM-CPU as an embedding model (the pooling
runner converting the causal LM: `runner="pooling", convert="embed"`, last-token pooling).

    python -m bench.request_typing.embeddings [--model PATH]     (starts vLLM: hold the machine's Ray/vLLM lock)

Prints the engine's start time and, per embedder and `min_similarity`, the accuracy on the 16
held-out prompts, then each prompt's label, typed scenario and best similarity.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence

from bench.request_typing.labelled_set import EXAMPLES, HELD_OUT, POLICY
from cluster.models import cache_dir
from router.request.embedding import Embedder, HashingEmbedder, Vector, normalised
from router.request.typing_rules import CentroidClassifier, RequestTyper
from router.routing.policy import Policy

THRESHOLDS = (0.0, 0.35, 0.5, 0.7, 0.8, 0.9)


class VllmEmbedder:
    """A causal LM as an embedding model through vLLM's offline pooling runner."""

    def __init__(self, model: str) -> None:
        # vLLM-CPU reserves its KV space up front (default: most of the machine's memory): 1 GiB is plenty here
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        from vllm import LLM  # heavy: only when this bench runs

        self.name = "vllm-pooling"
        self._llm = LLM(
            model=model, runner="pooling", convert="embed", dtype="float32", enforce_eager=True, max_model_len=512
        )

    def embed(self, texts: Sequence[str]) -> list[Vector]:
        return [normalised(list(out.outputs.embedding)) for out in self._llm.embed(list(texts), use_tqdm=False)]


def report(embedder: Embedder) -> None:
    policy = Policy.model_validate(POLICY)
    classifier = CentroidClassifier(embedder, EXAMPLES)
    for threshold in THRESHOLDS:
        typer = RequestTyper(policy, (), classifier, min_similarity=threshold)
        right = sum(typer.type(text).scenario == want for text, want in HELD_OUT)
        print(f"{embedder.name} min_similarity {threshold:g}: {right}/{len(HELD_OUT)}", flush=True)
    typer = RequestTyper(policy, (), classifier, min_similarity=0.0)
    for text, want in HELD_OUT:
        typed = typer.type(text)
        print(f"  {want!s:<11} -> {typed.scenario!s:<11} {typed.score}  {text[:50]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(cache_dir() / "smollm2-135m-instruct"))
    args = parser.parse_args()
    report(HashingEmbedder())
    started = time.monotonic()
    vllm_embedder = VllmEmbedder(args.model)
    print(f"vLLM pooling engine up in {time.monotonic() - started:.1f} s", flush=True)
    report(vllm_embedder)


if __name__ == "__main__":
    main()
