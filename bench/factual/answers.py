"""The two ways `bench factual` gets answers to the set (bench/factual/prompt_set.py):

    reference   the prepared model folder run by transformers in float32 (no custom kernels), greedy,
                the tokenizer's own chat template with the generation prompt, `max_new_tokens` tokens,
                one prompt at a time (no padding, so nothing but the prompt enters its numerics)
    served      the same messages to an OpenAI-compatible base URL (the gateway): non-streamed chat
                completions at temperature 0 and `max_tokens`, `concurrency` in flight, one pass over
                the whole set per concurrency level; each answer with its finish reason, usage
                (prompt and cached tokens: prefix-cache hits) and `x-spillover-route` / `-target`

`replica_view` reads what the gateway says of the model's replicas (`GET /v1/spillover/cluster`):
precision, CPU class, numerics state, fault and notes (router/routing/snapshot.py `ReplicaStats`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from bench.factual.check import Answer, graded
from bench.factual.prompt_set import FactualPrompt
from bench.load.loadgen import error_code
from cluster.capacity.plan import home_relative
from router import headers as hdr

Progress = Callable[[str], None]
REPLICA_KEYS = ("replica_id", "precision", "cpu_class", "numerics", "fault", "notes", "stale")


def reference_answers(
    folder: Path, prompts: Sequence[FactualPrompt], max_new_tokens: int, progress: Progress = lambda _: None
) -> tuple[dict[str, Answer], dict[str, Any]]:
    """The float32 reference's answers (by prompt id) and what produced them."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    answers: dict[str, Answer] = {}
    began = time.monotonic()
    for n, prompt in enumerate(prompts, 1):
        ids = tokenizer.apply_chat_template(prompt.messages(), add_generation_prompt=True, tokenize=True)
        if not isinstance(ids, list):  # newer transformers return a BatchEncoding
            ids = list(ids["input_ids"])  # type: ignore[index]  # transformers' stubs: a str only when tokenize=False
        start = time.monotonic()
        with torch.no_grad():
            out = model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.eos_token_id,
            )
        tokens = [int(t) for t in out[0][len(ids) :]]
        finish = "stop" if tokens and tokens[-1] == tokenizer.eos_token_id else "length"
        text = tokenizer.decode(tokens, skip_special_tokens=True).strip()  # type: ignore[union-attr]  # one sequence: a str
        answers[prompt.id] = graded(
            prompt, text, finish_reason=finish, prompt_tokens=len(ids), latency_s=time.monotonic() - start
        )
        if n % 20 == 0 or n == len(prompts):
            right = sum(1 for a in answers.values() if a.right)
            progress(f"[reference float32] {n}/{len(prompts)} done, {right} right ({time.monotonic() - began:.0f}s)")
    info = {
        "engine": f"transformers {transformers.__version__}",
        "torch": torch.__version__,
        "dtype": "float32",
        "model_dir": home_relative(str(folder)),  # a report names no machine path
        "max_new_tokens": max_new_tokens,
        "seconds": round(time.monotonic() - began, 1),
    }
    return answers, info


async def served_pass(
    client: httpx.AsyncClient,
    model: str,
    prompts: Sequence[FactualPrompt],
    *,
    concurrency: int,
    max_tokens: int,
    headers: Mapping[str, str] | None = None,
    request_timeout_s: float = 120.0,
    progress: Progress = lambda _: None,
    label: str = "",
) -> dict[str, Answer]:
    """One pass over `prompts` through `client` (bound to the base URL), `concurrency` in flight."""
    answers: dict[str, Answer] = {}
    pending = iter(prompts)
    began = time.monotonic()

    async def worker() -> None:
        for prompt in pending:
            answers[prompt.id] = await _ask(client, model, prompt, max_tokens, headers or {}, request_timeout_s)
            done = len(answers)
            if done % 50 == 0 or done == len(prompts):
                right = sum(1 for a in answers.values() if a.right)
                progress(f"[{label}] {done}/{len(prompts)} done, {right} right ({time.monotonic() - began:.0f}s)")

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(prompts)))))
    return answers


async def _ask(
    client: httpx.AsyncClient,
    model: str,
    prompt: FactualPrompt,
    max_tokens: int,
    headers: Mapping[str, str],
    timeout_s: float,
) -> Answer:
    body = {"model": model, "messages": prompt.messages(), "temperature": 0, "max_tokens": max_tokens}
    start = time.monotonic()
    try:
        response = await asyncio.wait_for(client.post("chat/completions", json=body, headers=dict(headers)), timeout_s)
    except TimeoutError:
        return graded(prompt, None, error="timeout", latency_s=time.monotonic() - start)
    except httpx.HTTPError as exc:
        return graded(prompt, None, error=f"transport:{type(exc).__name__}", latency_s=time.monotonic() - start)
    facts: dict[str, Any] = {
        "route": response.headers.get(hdr.ROUTE),
        "target": response.headers.get(hdr.TARGET),
        "latency_s": time.monotonic() - start,
    }
    if response.status_code != 200:
        return graded(prompt, None, error=error_code(response.content, response.status_code), **facts)
    try:
        data = response.json()
        choice = data["choices"][0]
        text = choice["message"]["content"]
        if not isinstance(text, str):
            raise TypeError
    except (ValueError, KeyError, IndexError, TypeError):
        return graded(prompt, None, error="malformed", **facts)
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    facts["finish_reason"] = choice.get("finish_reason")
    facts["prompt_tokens"] = usage.get("prompt_tokens") if isinstance(usage.get("prompt_tokens"), int) else None
    facts["cached_tokens"] = cached if isinstance(cached, int) else None
    return graded(prompt, text.strip(), **facts)


async def replica_view(client: httpx.AsyncClient, base: str, model: str) -> dict[str, Any]:
    """The model's replicas as `GET {base}/v1/spillover/cluster` shows them, or why they could not be read."""
    try:
        response = await client.get(f"{base}/v1/spillover/cluster")
    except httpx.HTTPError as exc:
        return {"error": f"{type(exc).__name__}", "replicas": []}
    if response.status_code != 200:
        return {
            "error": f"HTTP {response.status_code} {error_code(response.content, response.status_code)}",
            "replicas": [],
        }
    try:
        rows = response.json().get("replicas") or []
    except (ValueError, AttributeError):
        return {"error": "not JSON", "replicas": []}
    mine = [r for r in rows if isinstance(r, dict) and r.get("model") == model]
    return {"error": None, "replicas": [{k: r.get(k) for k in REPLICA_KEYS} for r in mine]}
