"""What the local engine (vLLM behind ray.serve.llm) may receive of a client's body: an allow-list.

vLLM's request models accept every field they know and ignore unknown ones, and they know many that
are engine controls rather than generation parameters. The body sent to a local model is therefore
rebuilt from the fields below (`engine_body`); everything else the client sent is dropped, as it is
for a cloud provider (serve_apps/providers/openai_compat.py).

Kept — OpenAI's own parameters, and vLLM sampling extensions that change only how the client's own
answer is sampled (bounded by `max_tokens`, checked by vLLM's types, a bad value is a 400):

    chat         messages, model, frequency_penalty, presence_penalty, logit_bias, logprobs,
                 top_logprobs, max_tokens, max_completion_tokens, n, seed, stop, stream,
                 stream_options, temperature, top_p, tools, tool_choice, parallel_tool_calls,
                 response_format, reasoning_effort, user (vLLM ignores it; no provider gets it)
    completions  model, prompt, echo, frequency_penalty, presence_penalty, logit_bias, logprobs,
                 max_tokens, n, seed, stop, stream, stream_options, suffix, temperature, top_p, user
    vLLM, both   top_k, min_p, repetition_penalty, stop_token_ids, include_stop_str_in_output,
                 ignore_eos, min_tokens, skip_special_tokens, spaces_between_special_tokens,
                 bad_words, allowed_token_ids, add_special_tokens, thinking_token_budget
    vLLM, chat   add_generation_prompt, continue_final_message (a prefill of the client's own last
                 message; stream continuations use them too), include_reasoning
    cache_salt   set by the gateway (router/request/cache_salt.py): with auth on the tenant's salt always
                 replaces the client's (which is only folded in), so no client can reach another's cache

Dropped — the reason for each group:

    chat_template, chat_template_kwargs   template code and variables: the client would rewrite how
                                          the gateway's messages become the prompt
    documents, mm_processor_kwargs,       input beside `messages` that the contract's filters,
    media_io_kwargs, prompt_embeds        typing and session anchors never see (prompt_embeds are
                                          tensors the engine deserialises)
    structured_outputs                    grammars and regexes the engine compiles, not checked as
                                          the gateway checks response_format's JSON Schema
    use_beam_search, prompt_logprobs,     work or answers far beyond what admission and the cost
    truncate_prompt_tokens,               estimate count (a truncation the gateway does not see
    truncation_side                       changes the prompt it measured)
    priority, request_id, session_id      the engine's scheduling and the gateway's own ids
    kv_transfer_params,                   disaggregated-serving controls: where the engine fetches
    ec_transfer_params, vllm_xargs        or sends KV / encoder caches, custom extensions
    return_*, mm_payload, logprob_token_  answer shapes the gateway's accounting does not read
    ids, routed_experts_prompt_start,
    repetition_detection, watermarking,
    stream_interval
    metadata, store, prompt_cache_key,    OpenAI's account-side fields: no engine input (a session
    best_of, service_tier, ...            is named by x-spillover-session)

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from router.request.cache_salt import FIELD as CACHE_SALT
from router.request.openai_request import Kind

_COMMON = frozenset(
    {
        "model",
        "frequency_penalty",
        "presence_penalty",
        "logit_bias",
        "logprobs",
        "max_tokens",
        "n",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "temperature",
        "top_p",
        "user",
    }
)
OPENAI_FIELDS: Mapping[str, frozenset[str]] = {
    "chat": _COMMON
    | {
        "messages",
        "top_logprobs",
        "max_completion_tokens",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "reasoning_effort",
    },
    "completions": _COMMON | {"prompt", "echo", "suffix"},
}
VLLM_SAMPLING = frozenset(
    {
        "top_k",
        "min_p",
        "repetition_penalty",
        "stop_token_ids",
        "include_stop_str_in_output",
        "ignore_eos",
        "min_tokens",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "bad_words",
        "allowed_token_ids",
        "add_special_tokens",
        "thinking_token_budget",
    }
)
VLLM_CHAT = frozenset({"add_generation_prompt", "continue_final_message", "include_reasoning"})
ENGINE_FIELDS: Mapping[str, frozenset[str]] = {
    "chat": OPENAI_FIELDS["chat"] | VLLM_SAMPLING | VLLM_CHAT | {CACHE_SALT},
    "completions": OPENAI_FIELDS["completions"] | VLLM_SAMPLING | {CACHE_SALT},
}


def engine_body(kind: Kind, body: Mapping[str, Any]) -> dict[str, Any]:
    """The client's body with only the fields a local engine may receive (see the module docstring)."""
    allowed = ENGINE_FIELDS[kind]
    return {k: v for k, v in body.items() if k in allowed}
