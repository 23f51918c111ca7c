"""Prompts for a scaled trace: the trace's token counts as words (bench/load/workload.py: one token each in
the usual BPE vocabularies), with its prefix sharing kept.

A trace that lists a prompt's blocks (`hash_ids`: Mooncake) gets one word sequence per block id, drawn from the
id and the seed: two requests whose blocks start alike start with the same words, so the engine's prefix cache
sees what it saw in production; the prompt is its blocks' words cut to its (scaled) length, filled with words
of its own when the blocks are shorter. A trace without blocks gets words of the request's own. The same trace,
scaling, seed and salt give byte-identical prompts.

`salt` keeps policies apart: `bench replay` builds each policy's prompts with its own salt, so they have the same
lengths and the same sharing among themselves but no words in common with another policy's — a policy replayed
after another would otherwise find the first one's prompts in the engine's prefix cache and look faster.
"""

from __future__ import annotations

import random

from bench.load.workload import WorkItem, words
from bench.replay.scaling import ScaledRequest


class PromptBuilder:
    def __init__(self, seed: int = 0, salt: str = "") -> None:
        self._seed = f"{seed}:{salt}" if salt else str(seed)
        self._blocks: dict[tuple[int, int], list[str]] = {}

    def item(self, index: int, request: ScaledRequest) -> WorkItem:
        text: list[str] = []
        if request.block_words is not None:
            for block in request.hash_ids:
                if len(text) >= request.input_tokens:
                    break
                text.extend(self._block(block, request.block_words))
        text = text[: request.input_tokens]
        if len(text) < request.input_tokens:
            own = random.Random(f"{self._seed}:request:{index}")
            text.extend(words(own, request.input_tokens - len(text)).split())
        prompt = " ".join(text)
        return WorkItem(index, ({"role": "user", "content": prompt},), request.output_tokens, len(text), None)

    def _block(self, block: int, size: int) -> list[str]:
        key = (block, size)
        if key not in self._blocks:
            self._blocks[key] = words(random.Random(f"{self._seed}:block:{block}"), size).split()
        return self._blocks[key]
