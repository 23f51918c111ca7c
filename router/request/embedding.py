"""Text embeddings for request typing, behind a protocol so a real embedding model plugs in.

    Embedder.embed(texts) -> one unit vector per text (any fixed dimension)

`HashingEmbedder` is the one the project ships: word unigrams and character trigrams of the
lower-cased text hashed (BLAKE2b, so stable across processes) into `dim` signed buckets, then
L2-normalised. No weights to download, deterministic, ~0.1 ms per short prompt. It captures
vocabulary overlap, not meaning: "refund my order" and "I want my money back" are far apart. A
model served with an OpenAI-compatible `/v1/embeddings` endpoint (vLLM's pooling runner, a cloud
API) is a better embedder; wrap it in this protocol and give it to `CentroidClassifier`.
Texts are cut to `MAX_CHARS` characters first. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence
from typing import Protocol

MAX_CHARS = 4000
_WORD = re.compile(r"\w+", re.UNICODE)

Vector = list[float]


class Embedder(Protocol):
    @property
    def name(self) -> str: ...

    def embed(self, texts: Sequence[str]) -> list[Vector]: ...


def normalised(vector: Sequence[float]) -> Vector:
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector] if norm > 0 else list(vector)


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Of two unit vectors (0 when either is zero)."""
    return sum(x * y for x, y in zip(a, b, strict=True))


class HashingEmbedder:
    def __init__(self, dim: int = 512) -> None:
        self.dim = dim
        self.name = f"hashing-{dim}"

    def _features(self, text: str) -> list[str]:
        text = text[:MAX_CHARS].lower()
        words = _WORD.findall(text)
        grams = [f"#{w[i : i + 3]}" for w in words for i in range(max(1, len(w) - 2))]
        return words + grams

    def embed(self, texts: Sequence[str]) -> list[Vector]:
        out = []
        for text in texts:
            vector = [0.0] * self.dim
            for feature in self._features(text):
                digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
                index = int.from_bytes(digest[:4], "little") % self.dim
                vector[index] += 1.0 if digest[4] & 1 else -1.0
            out.append(normalised(vector))
        return out
