"""The request contract: everything a target must satisfy to serve one request.

`derive_contract(body, headers, policy)` reads an OpenAI chat (or completions) body and the
client's `x-*` headers (router/request/contract_headers.py) into a frozen `RequestContract`. Pure: no I/O.

What the body asks for:

    tools declared, or tool calls / tool results in the history      needs_tools
    parallel_tool_calls: true (explicitly) and more than one tool    needs_parallel_tools
    response_format {"type": "json_schema", ...}                    needs_json_schema (+ the schema)
    response_format {"type": "json_object"}                         needs_json_mode
    stream: true                                                    needs_streaming
    tool_choice "required" / a named function                       must_call ("*" / the name)
    a completions body (`prompt`, no `messages`)                    api "completions"
    completions echo: true / logprobs                               needs_echo / needs_logprobs
    content parts image_url / input_audio / file                    modality image / audio / file

An invalid JSON Schema (response_format or a tool's `parameters`) is a 400 `invalid_json_schema`
naming the schema error: a wrong schema must fail here, not on whichever target is tried first.
So is a schema with a `$ref` outside the document (nothing is fetched) or a reference cycle that
would never end (router/request/json_schema.py).

Prompt tokens are an ESTIMATE: with `count_tokens`, its count over every text part (and the tool
definitions) plus 4 per message; without it, ceil(characters / 4) + 4 per message. A completions
prompt given as token ids counts one per id. Image, audio and file parts are not counted. The
engine still checks the exact length. `min_context` = estimate + `max_output_tokens` (the request's
max_completion_tokens / max_tokens, else `default_max_tokens`; `max_tokens_given` says which). `n`
(choices, 1 to 128) multiplies the output a cost estimate counts (router/limits/budget.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from router.error_codes import ErrorCode
from router.errors import InvalidRequest
from router.request import contract_headers as h
from router.request.json_schema import MAX_SCHEMA_OBJECTS, check_client_schema, count_objects
from router.request.language import script_of
from router.request.openai_request import Kind, max_tokens_of
from router.routing.policy import Level, Policy, RouteOrder, Strategy
from router.sessions.carried import Label
from router.sessions.session_id import session_id_of

PER_MESSAGE_TOKENS = 4
MAX_N = 128  # choices per request, as OpenAI's API allows
CHARS_PER_TOKEN = 4
_PART_MODALITIES = {"image_url": "image", "input_audio": "audio", "file": "file"}


@dataclass(frozen=True)
class RequestContract:
    model: str
    scenario: str
    level: Level
    strategy: Strategy
    needs_tools: bool = False
    needs_parallel_tools: bool = False
    needs_json_schema: bool = False
    needs_json_mode: bool = False
    needs_streaming: bool = False
    api: Kind = "chat"  # the API it came through: "completions" needs a target that serves /v1/completions
    needs_echo: bool = False  # completions `echo: true`
    needs_logprobs: bool = False  # completions `logprobs`
    modalities: frozenset[str] = frozenset({"text"})
    est_prompt_tokens: int = 0
    max_output_tokens: int = 256
    max_tokens_given: bool = True  # False: the body named no max_tokens and max_output_tokens is the default
    n: int = 1  # choices asked for: each may produce up to the output limit (router/limits/budget.py)
    route_order: RouteOrder = "route"  # the scenario's: how a route's targets are ordered (router/routing/plan.py)
    residency: h.Residency = "any"
    allowed_providers: frozenset[str] | None = None
    allowed_target_patterns: tuple[str, ...] = ("*",)
    max_cost_usd: float | None = None
    deadline_ms: int | None = None
    quality_floor: float = 0.0
    tenant: str | None = None  # set by router.request.auth.narrow_for_tenant when gateway auth is on
    session: str | None = None  # the conversation it belongs to (router/sessions/session_id.py)
    json_schema: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)
    tool_schemas: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, compare=False, hash=False)
    must_call: str | None = None  # tool_choice: "*" (required: some declared tool) or the function named; None
    inputs: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)  # contract headers given
    language: str = "none"  # the prompt's script (router/request/language.py), a quality bucket's `lang`
    typing: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)  # how the scenario was typed
    carried: Label | None = None  # what the turn's session carries, and where it may go (router/sessions/carried.py)

    @property
    def local_only(self) -> bool:
        """Whether it may not leave the cluster: its own residency, or the context its session carries."""
        return self.residency == "local_only" or (self.carried is not None and self.carried.residency == "local_only")

    @property
    def checks_output(self) -> bool:
        """Whether the answer is validated before it is sent (JSON schema / mode, tool arguments)."""
        return self.needs_json_schema or self.needs_json_mode or bool(self.tool_schemas)

    @property
    def min_context(self) -> int:
        return self.est_prompt_tokens + self.max_output_tokens

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe, for decision records."""
        residency = self.residency if isinstance(self.residency, str) else sorted(self.residency)
        providers = None if self.allowed_providers is None else sorted(self.allowed_providers)
        return {
            "model": self.model,
            "scenario": self.scenario,
            "level": self.level,
            "strategy": self.strategy,
            "needs_tools": self.needs_tools,
            "needs_parallel_tools": self.needs_parallel_tools,
            "needs_json_schema": self.needs_json_schema,
            "needs_json_mode": self.needs_json_mode,
            "needs_streaming": self.needs_streaming,
            "api": self.api,
            "needs_echo": self.needs_echo,
            "needs_logprobs": self.needs_logprobs,
            "modalities": sorted(self.modalities),
            "est_prompt_tokens": self.est_prompt_tokens,
            "max_output_tokens": self.max_output_tokens,
            "max_tokens_given": self.max_tokens_given,
            "n": self.n,
            "route_order": self.route_order,
            "min_context": self.min_context,
            "residency": residency,
            "allowed_providers": providers,
            "allowed_target_patterns": list(self.allowed_target_patterns),
            "max_cost_usd": self.max_cost_usd,
            "deadline_ms": self.deadline_ms,
            "quality_floor": self.quality_floor,
            "tenant": self.tenant,
            "session": self.session,
            "json_schema": self.json_schema,
            "tools": sorted(self.tool_schemas),
            "must_call": self.must_call,
            "language": self.language,
            "typing": None if self.typing is None else dict(self.typing),
            "carried": None if self.carried is None else self.carried.to_json(),
        }


def check_json_schema(schema: Any, param: str) -> dict[str, Any]:
    """The schema itself, or 400 `invalid_json_schema` (router/request/json_schema.py: metaschema, no
    reference outside the document, no endless reference cycle, patterns that compile)."""
    return check_client_schema(schema, param)


def _response_format(body: Mapping[str, Any]) -> tuple[bool, bool, dict[str, Any] | None]:
    """(needs_json_schema, needs_json_mode, schema)."""
    fmt = body.get("response_format")
    if fmt is None:
        return False, False, None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return False, False, None
    if kind == "json_object":
        return False, True, None
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise InvalidRequest(
                "response_format.json_schema.schema is required for type json_schema",
                param="response_format.json_schema.schema",
                code=ErrorCode.INVALID_JSON_SCHEMA,
            )
        return True, False, check_json_schema(spec["schema"], "response_format.json_schema.schema")
    raise InvalidRequest("response_format.type must be text, json_object or json_schema", param="response_format.type")


def _tools(body: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    tools = body.get("tools")
    if tools is None:
        return {}
    if not isinstance(tools, list):
        raise InvalidRequest("tools must be an array", param="tools")
    schemas: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            raise InvalidRequest(f"tools[{i}].function.name is required", param=f"tools[{i}].function.name")
        params = fn.get("parameters", {}) if isinstance(fn, dict) else {}
        schemas[name] = check_json_schema(params, f"tools[{i}].function.parameters")
    return schemas


def _must_call(body: Mapping[str, Any], tools: Mapping[str, Any]) -> str | None:
    """What `tool_choice` obliges the answer to call: "*" for "required", the name for a named function."""
    choice = body.get("tool_choice")
    if choice == "required" or isinstance(choice, dict):
        if not tools:
            raise InvalidRequest("tool_choice asks for a tool call but the request has no tools", param="tool_choice")
    if choice == "required":
        return "*"
    if isinstance(choice, dict) and choice.get("type") == "function":
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or name not in tools:
            raise InvalidRequest("tool_choice names a function that tools does not declare", param="tool_choice")
        return name
    return None


def _history_has_tools(messages: list[Any]) -> bool:
    return any(isinstance(m, dict) and (m.get("role") == "tool" or m.get("tool_calls")) for m in messages)


def _prompt_parts(prompt: Any) -> tuple[list[str], int]:
    """A completions `prompt`: its texts and its count of token ids (str, [str], [int] or [[int]])."""
    if isinstance(prompt, str):
        return [prompt], 0
    if not isinstance(prompt, list):
        return [], 0
    texts = [p for p in prompt if isinstance(p, str)]
    ids = sum(1 for p in prompt if isinstance(p, int)) + sum(len(p) for p in prompt if isinstance(p, list))
    return texts, ids


def _texts_and_modalities(body: Mapping[str, Any]) -> tuple[list[str], int, int, frozenset[str]]:
    """Every text of the prompt, the count of token ids, the message count and the input modalities."""
    modalities = {"text"}
    messages = body.get("messages")
    if not isinstance(messages, list):
        prompt_texts, ids = _prompt_parts(body.get("prompt"))
        return prompt_texts, ids, 0, frozenset(modalities)
    texts: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "text" and isinstance(part.get("text"), str):
                    texts.append(part["text"])
                elif kind in _PART_MODALITIES:
                    modalities.add(_PART_MODALITIES[kind])
        for call in message.get("tool_calls") or []:
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict):
                texts += [str(fn.get("name", "")), str(fn.get("arguments", ""))]
    return texts, 0, len(messages), frozenset(modalities)


def estimate_prompt_tokens(
    body: Mapping[str, Any], count_tokens: Callable[[str], int] | None = None
) -> tuple[int, frozenset[str]]:
    texts, token_ids, n_messages, modalities = _texts_and_modalities(body)
    if body.get("tools"):
        texts.append(json.dumps(body["tools"], separators=(",", ":")))
    if count_tokens is not None:
        tokens = sum(count_tokens(t) for t in texts)
    else:
        tokens = math.ceil(sum(len(t) for t in texts) / CHARS_PER_TOKEN)
    return tokens + token_ids + PER_MESSAGE_TOKENS * n_messages, modalities


def _max_output(body: Mapping[str, Any], default: int) -> int:
    given = max_tokens_of(body)
    return default if given is None else given


def choices_of(body: Mapping[str, Any]) -> int:
    """`n`, 1 when absent; 400 unless an integer from 1 to MAX_N (each choice is paid for)."""
    n = body.get("n")
    if n is None:
        return 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise InvalidRequest(f"`n` must be an integer from 1 to {MAX_N}", param="n")
    return n


def derive_contract(
    body: Mapping[str, Any],
    headers: Mapping[str, str],
    policy: Policy,
    *,
    default_max_tokens: int = 256,
    count_tokens: Callable[[str], int] | None = None,
) -> RequestContract:
    """The contract of one request. Raises `InvalidRequest` (400) for bad headers or schemas."""
    hdr = h.lower_keys(headers)
    terms = scenario_terms(hdr, policy)

    schemas = [body.get("response_format"), body.get("tools")]
    if count_objects(schemas, MAX_SCHEMA_OBJECTS) > MAX_SCHEMA_OBJECTS:  # every schema of the request together
        raise InvalidRequest(
            f"response_format and tools hold more than {MAX_SCHEMA_OBJECTS} JSON objects together: send smaller "
            "schemas",
            param="tools" if body.get("tools") else "response_format",
            code=ErrorCode.INVALID_JSON_SCHEMA,
        )
    api: Kind = "chat" if "messages" in body or "prompt" not in body else "completions"
    needs_schema, needs_json_mode, schema = _response_format(body)
    tool_schemas = _tools(body)
    messages = body.get("messages")
    history_tools = isinstance(messages, list) and _history_has_tools(messages)
    prompt_tokens, modalities = estimate_prompt_tokens(body, count_tokens)
    session = session_id_of(body, hdr)
    language = script_of(_texts_and_modalities(body)[0])
    return RequestContract(
        model=str(body.get("model", "")),
        needs_tools=bool(tool_schemas) or history_tools,
        needs_parallel_tools=body.get("parallel_tool_calls") is True and len(tool_schemas) > 1,
        needs_json_schema=needs_schema,
        needs_json_mode=needs_json_mode,
        needs_streaming=body.get("stream") is True,
        api=api,
        needs_echo=api == "completions" and body.get("echo") is True,
        needs_logprobs=api == "completions" and body.get("logprobs") not in (None, False),
        modalities=modalities,
        est_prompt_tokens=prompt_tokens,
        max_output_tokens=_max_output(body, default_max_tokens),
        session=session.value if session is not None else None,
        max_tokens_given=max_tokens_of(body) is not None,
        n=choices_of(body),
        json_schema=schema,
        tool_schemas=tool_schemas,
        must_call=_must_call(body, tool_schemas),
        language=language,
        **terms,
    )


def contract_inputs(headers: Mapping[str, str]) -> dict[str, str]:
    """The contract headers a client sent (lower-case names), as decision records keep them for replay."""
    return {k: v for k, v in headers.items() if k in h.CONTRACT_HEADERS}


def scenario_terms(hdr: Mapping[str, str], policy: Policy) -> dict[str, Any]:
    """What the scenario and the contract headers (lower-case names) fix: the scenario's terms, narrowed
    by the headers. Raises `InvalidRequest` (400) for bad headers. Replays call it with a new policy."""
    name, scenario = h.resolve_scenario(hdr, policy)
    deadline = h.narrowed_min(scenario.deadline_ms, h.DEADLINE_HEADER, hdr.get(h.DEADLINE_HEADER), int)
    return {
        "scenario": name,
        "level": h.stricter_level(scenario.level, hdr.get(h.LEVEL_HEADER)),
        "strategy": scenario.strategy,
        "residency": h.narrow_residency(h.scenario_residency(scenario), h.parse_residency(hdr.get(h.RESIDENCY_HEADER))),
        "allowed_providers": h.parse_providers(hdr.get(h.PROVIDERS_HEADER)),
        "allowed_target_patterns": tuple(scenario.allowed_targets),
        "max_cost_usd": h.narrowed_min(scenario.max_cost_usd, h.MAX_COST_HEADER, hdr.get(h.MAX_COST_HEADER), float),
        "deadline_ms": None if deadline is None else int(deadline),
        "quality_floor": scenario.quality_floor,
        "route_order": scenario.route_order,
        "inputs": contract_inputs(hdr),
    }
