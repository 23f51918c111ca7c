"""The local engine receives only the fields the adapter knows (router/request/engine_fields.py): OpenAI's
parameters and the allow-listed vLLM sampling extensions; engine controls a client could abuse
(`kv_transfer_params`, `vllm_xargs`, `priority`, `request_id`, `chat_template`, `chat_template_kwargs`,
`structured_outputs`, `prompt_embeds`, ...) never pass, and a client's `cache_salt` never replaces the
gateway's. Sent to the real HTTP layer (tests/unit/security_gateway.py); FakeEngine records the body
exactly as the local backend would hand it to ray.serve.llm.
"""

from __future__ import annotations

from typing import Any

import pytest

from router.request.cache_salt import tenant_salt
from router.request.engine_fields import ENGINE_FIELDS, engine_body
from tests.fakes import FakeEngine
from tests.unit.security_gateway import APPS, CHAT, MODEL, build

HOSTILE = {
    "kv_transfer_params": {"remote_host": "10.0.0.9", "remote_port": 1, "do_remote_prefill": True},
    "ec_transfer_params": {"x": 1},
    "vllm_xargs": {"debug": "1"},
    "priority": -1000,
    "request_id": "someone-elses-id",
    "session_id": "s",
    "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}{{ ''.__class__ }}",
    "chat_template_kwargs": {"chat_template": "x", "enable_thinking": True},
    "structured_outputs": {"regex": "(a+)+$"},
    "prompt_embeds": "AAAA",
    "documents": [{"title": "t", "text": "hidden from the filters"}],
    "mm_processor_kwargs": {"x": 1},
    "media_io_kwargs": {"image": {"x": 1}},
    "use_beam_search": True,
    "prompt_logprobs": 20,
    "truncate_prompt_tokens": 1,
    "return_prompt_text": True,
    "return_token_ids": True,
    "metadata": {"k": "v"},
    "store": True,
    "prompt_cache_key": "k",
    "made_up": 1,
}
ALLOWED = {
    "top_k": 5,
    "min_p": 0.1,
    "repetition_penalty": 1.1,
    "stop_token_ids": [2],
    "skip_special_tokens": False,
    "ignore_eos": True,
    "min_tokens": 1,
    "temperature": 0.2,
    "max_tokens": 8,
}


async def test_local_engine_gets_only_known_fields() -> None:
    engine = FakeEngine(answer="ok")
    gateway = build(local=engine)
    body = {**CHAT, **HOSTILE, **ALLOWED, "cache_salt": "client-chosen"}
    async with gateway.client() as c:
        response = await c.post("/v1/chat/completions", json=body, headers=APPS)
    assert response.status_code == 200, response.text
    ((alias, kind, sent, _),) = engine.calls
    assert (alias, kind) == (MODEL, "chat")
    assert not set(HOSTILE) & set(sent)
    assert {k: sent[k] for k in ALLOWED} == ALLOWED
    assert sent["messages"] == CHAT["messages"] and sent["model"] == MODEL
    assert sent["cache_salt"] == tenant_salt("apps", "client-chosen")  # the gateway's, the client's folded in


async def test_local_engine_gets_only_known_fields_for_completions() -> None:
    engine = FakeEngine(answer="ok")
    gateway = build(local=engine)
    body = {"model": MODEL, "prompt": "hi", "echo": True, "suffix": "!", **HOSTILE, "top_k": 3}
    async with gateway.client() as c:
        response = await c.post("/v1/completions", json=body, headers=APPS)
    assert response.status_code == 200, response.text
    ((_, kind, sent, _),) = engine.calls
    assert kind == "completions" and not set(HOSTILE) & set(sent)
    assert (sent["prompt"], sent["echo"], sent["suffix"], sent["top_k"]) == ("hi", True, "!", 3)


def test_local_engine_gets_only_known_fields_keeps_the_stream_continuation_prefill() -> None:
    """A stream continuation (serve_apps/streams/continuation.py) sends a prefill with vLLM's two chat flags."""
    body: dict[str, Any] = {**CHAT, "continue_final_message": True, "add_generation_prompt": False}
    assert engine_body("chat", body) == body


@pytest.mark.parametrize("kind", ["chat", "completions"])
def test_local_engine_gets_only_known_fields_that_vllm_knows(kind: str) -> None:
    """Every allow-listed field is a field of the request model the local backend builds (a typo would
    silently drop a parameter), and every engine control named above is one too (the list is real)."""
    pytest.importorskip("vllm")
    from ray.serve.llm.openai_api_models import ChatCompletionRequest, CompletionRequest

    request = ChatCompletionRequest if kind == "chat" else CompletionRequest
    known = set(request.model_fields)
    assert ENGINE_FIELDS[kind] <= known, sorted(ENGINE_FIELDS[kind] - known)
    controls = {"kv_transfer_params", "vllm_xargs", "priority", "request_id", "structured_outputs"}
    assert controls <= known
