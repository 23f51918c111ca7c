"""The replica-side numerics check: its own engine's greedy tokens against the model's reference.

Run by the model replica (serve_apps/engine/llm_server.py) before it takes traffic and then every
`models[].numerics.interval_s`, straight on the engine (vLLM's AsyncLLM `generate`), off the request
path: no gateway, HTTP or Serve hop, and the prompt token ids are the reference's own
(cluster/precision/numerics_reference.py), so only numerics can differ. Each check salts its prompts' prefix-cache
keys afresh, so it recomputes the prefill too rather than reading KV blocks an earlier check left.
The verdict (cluster/precision/numerics_check.py) travels in the replica's pushed stats: a replica that fails
leaves routing at once (router/routing/snapshot.py `ReplicaStats.fault`).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Mapping
from typing import Any

from cluster.config.numerics import NumericsSettings
from cluster.precision.numerics_check import NumericsVerdict, judge

log = logging.getLogger("spillover.numerics")


async def greedy_tokens(client: Any, reference: Mapping[str, Any], salt: str) -> list[list[int]]:
    """The engine's greedy tokens for every reference prompt (run together, as one batch would)."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=int(reference["max_tokens"]), seed=0)

    async def one(index: int, prompt: Mapping[str, Any]) -> list[int]:
        last = None
        tokens = {"prompt_token_ids": list(prompt["prompt_token_ids"]), "cache_salt": salt}
        async for out in client.generate(tokens, params, f"spillover-numerics-{salt}-{index}"):
            last = out
        return [] if last is None else [int(t) for t in last.outputs[0].token_ids]

    return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(reference["prompts"]))))


async def check(client: Any, reference: Mapping[str, Any], settings: NumericsSettings, dtype: str) -> NumericsVerdict:
    """One check; an engine that errors or takes longer than `timeout_s` fails it."""
    salt = uuid.uuid4().hex[:12]
    try:
        got = await asyncio.wait_for(greedy_tokens(client, reference, salt), settings.timeout_s)
    except TimeoutError:
        return NumericsVerdict("failed", f"numerics check failed: no answer within {settings.timeout_s:g}s")
    except Exception as exc:  # noqa: BLE001 - any engine failure fails the check, by name
        return NumericsVerdict("failed", f"numerics check failed: the engine raised {type(exc).__name__}")
    verdict = judge(
        reference,
        got,
        first_tokens=settings.first_tokens,
        min_agreeing=settings.min_agreeing(dtype),
        label=dtype,
    )
    (log.info if verdict.routable else log.error)("%s", verdict.reason)
    return verdict
