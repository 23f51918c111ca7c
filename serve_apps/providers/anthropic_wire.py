"""OpenAI chat completions <-> Anthropic Messages API, as pure functions (no I/O, no clock).

`messages_request(body, model, default_max_tokens)` turns an OpenAI chat body into a Messages
body; `chat_completion(message, created)` turns a Messages reply into an OpenAI chat completion;
`ChunkTranslator` turns the Messages SSE events into OpenAI `chat.completion.chunk` objects.

Requests:
    system / developer messages   hoisted into the top-level `system` (joined by a blank line, in order)
    user content parts            text -> text block; image_url -> image block (data: URL -> base64
                                  source, http(s) -> url source); any other part -> 400
    assistant tool_calls          tool_use blocks (`arguments` must be a JSON object, else 400)
    tool messages                 tool_result blocks in a user turn (consecutive ones share it)
    consecutive same-role turns   merged into one turn (the Messages API alternates roles)
    max_completion_tokens /       max_tokens (required by the Messages API: when the client sent
      max_tokens                  none, `default_max_tokens`)
    stop                          stop_sequences
    tools / tool_choice           input_schema tools; auto / none / required (-> any) / a named
                                  function (-> tool); parallel_tool_calls false ->
                                  disable_parallel_tool_use
    temperature, top_p, stream    as they are (the provider checks its own ranges)
    seed, frequency_penalty,      dropped: the Messages API has no such parameters
      presence_penalty, reasoning_effort, stream_options
    n > 1, logprobs, logit_bias,  400 `provider_rejected`: the client would miss them in the answer
      response_format (not text)

Replies:
    text blocks -> `content` (joined); tool_use blocks -> `tool_calls` (`input` as JSON arguments);
    stop_reason end_turn / stop_sequence / pause_turn -> stop, max_tokens /
    model_context_window_exceeded -> length, tool_use -> tool_calls, refusal -> content_filter;
    usage: prompt_tokens = input + cache read + cache creation tokens, cached_tokens = cache read.
A reply or event that does not have the documented shape raises `UpstreamError`
(`provider_malformed`); an `error` event raises `UpstreamError` (`provider_stream_error`).
"""

from __future__ import annotations

import json
from typing import Any

from router.error_codes import ErrorCode
from router.errors import InvalidRequest, ProviderRejected, UpstreamError
from serve_apps.providers.bounded import loads

FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
DROPPED_FIELDS = frozenset({"seed", "frequency_penalty", "presence_penalty", "reasoning_effort", "stream_options"})
_MEDIA_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})


def messages_request(body: dict[str, Any], model: str, default_max_tokens: int) -> dict[str, Any]:
    """The Messages API body for an OpenAI chat body (already type-checked by the gateway)."""
    _refuse_untranslatable(body)
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for i, message in enumerate(body.get("messages") or []):
        role = message.get("role")
        if role in ("system", "developer"):
            system.append(_text_only(message.get("content"), f"messages[{i}].content"))
            continue
        if role == "user":
            _append(turns, "user", _user_blocks(message.get("content"), i))
        elif role == "assistant":
            _append(turns, "assistant", _assistant_blocks(message, i))
        elif role == "tool":
            _append(turns, "user", [_tool_result(message, i)])
        else:
            raise InvalidRequest(f"messages[{i}].role {role!r} cannot be sent to the Messages API", param="messages")
    out: dict[str, Any] = {"model": model, "messages": turns, "max_tokens": _max_tokens(body, default_max_tokens)}
    if system:
        out["system"] = "\n\n".join(system)
    for name in ("temperature", "top_p", "stream"):
        if body.get(name) is not None:
            out[name] = body[name]
    stop = body.get("stop")
    if stop is not None:
        out["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    if body.get("tools"):
        out["tools"] = [_tool(t) for t in body["tools"]]
    choice = _tool_choice(body.get("tool_choice"), body.get("parallel_tool_calls"))
    if choice is not None and body.get("tools"):
        out["tool_choice"] = choice
    return out


def _refuse_untranslatable(body: dict[str, Any]) -> None:
    def refuse(param: str, what: str) -> None:
        message = f"the Messages API cannot {what}; send it to an OpenAI-compatible target"
        raise ProviderRejected(message, param=param)

    n = body.get("n")
    if isinstance(n, int) and n > 1:
        refuse("n", "return several choices (n > 1)")
    if body.get("logprobs") or body.get("top_logprobs"):
        refuse("logprobs", "return log probabilities")
    if body.get("logit_bias"):
        refuse("logit_bias", "bias tokens (logit_bias)")
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") not in (None, "text"):
        refuse("response_format", "take a response_format")


def _max_tokens(body: dict[str, Any], default: int) -> int:
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return default


def _append(turns: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    if not blocks:
        return
    if turns and turns[-1]["role"] == role:
        turns[-1]["content"].extend(blocks)
    else:
        turns.append({"role": role, "content": list(blocks)})


def _text_only(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise InvalidRequest(f"{where}: only text parts can be sent to the Messages API here", param="messages")
            texts.append(part["text"])
        return "\n".join(texts)
    if content is None:
        return ""
    raise InvalidRequest(f"{where} must be a string or a list of parts", param="messages")


def _user_blocks(content: Any, i: int) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if not isinstance(content, list):
        raise InvalidRequest(f"messages[{i}].content must be a string or a list of parts", param="messages")
    blocks = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            blocks.append({"type": "text", "text": part["text"]})
        elif kind == "image_url":
            blocks.append(_image(part.get("image_url"), f"messages[{i}].content[{j}]"))
        else:
            message = f"messages[{i}].content[{j}]: a {kind!r} part cannot be sent to the Messages API"
            raise ProviderRejected(message, param="messages")
    return blocks


def _image(spec: Any, where: str) -> dict[str, Any]:
    url = spec.get("url") if isinstance(spec, dict) else spec
    if not isinstance(url, str):
        raise InvalidRequest(f"{where}.image_url.url must be a string", param="messages")
    if url.startswith("data:"):
        header, _, data = url[5:].partition(",")
        media_type, _, encoding = header.partition(";")
        if encoding != "base64" or media_type not in _MEDIA_TYPES or not data:
            message = f"{where}: a data URL must be base64 {', '.join(sorted(_MEDIA_TYPES))}"
            raise ProviderRejected(message, param="messages")
        return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}
    if url.startswith(("https://", "http://")):
        return {"type": "image", "source": {"type": "url", "url": url}}
    raise ProviderRejected(f"{where}: an image URL must be a data: or http(s) URL", param="messages")


def _assistant_blocks(message: dict[str, Any], i: int) -> list[dict[str, Any]]:
    text = _text_only(message.get("content"), f"messages[{i}].content")
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    for j, call in enumerate(message.get("tool_calls") or []):
        where = f"messages[{i}].tool_calls[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InvalidRequest(f"{where}.function.name is required", param="messages")
        raw_arguments = function.get("arguments") or "{}"
        arguments = loads(raw_arguments) if isinstance(raw_arguments, str) else None  # too deep, lone surrogates: None
        if not isinstance(arguments, dict):
            raise InvalidRequest(f"{where}.function.arguments must be a JSON object", param="messages")
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id:
            raise InvalidRequest(f"{where}.id is required", param="messages")
        blocks.append({"type": "tool_use", "id": call_id, "name": function["name"], "input": arguments})
    return blocks


def _tool_result(message: dict[str, Any], i: int) -> dict[str, Any]:
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        raise InvalidRequest(f"messages[{i}].tool_call_id is required for a tool message", param="messages")
    return {"type": "tool_result", "tool_use_id": call_id, "content": _text_only(message.get("content"), "content")}


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = tool.get("function") or {}
    schema = function.get("parameters") or {"type": "object", "properties": {}}
    out = {"name": function.get("name"), "input_schema": schema}
    if isinstance(function.get("description"), str):
        out["description"] = function["description"]
    return out


def _tool_choice(choice: Any, parallel: Any) -> dict[str, Any] | None:
    out: dict[str, Any] | None
    if choice is None:
        out = {"type": "auto"} if parallel is False else None
    elif choice == "auto":
        out = {"type": "auto"}
    elif choice == "none":
        return {"type": "none"}
    elif choice == "required":
        out = {"type": "any"}
    elif isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        out = {"type": "tool", "name": choice["function"].get("name")}
    else:
        raise InvalidRequest(f"tool_choice {choice!r} cannot be sent to the Messages API", param="tool_choice")
    if out is not None and parallel is False:
        out["disable_parallel_tool_use"] = True
    return out


# -- replies -----------------------------------------------------------------------------------


def malformed(provider: str, what: str) -> UpstreamError:
    return UpstreamError(f"cloud provider {provider!r} sent {what}", code=ErrorCode.PROVIDER_MALFORMED)


def chat_completion(message: Any, created: int, provider: str) -> dict[str, Any]:
    """The OpenAI chat completion for a complete Messages reply."""
    if (
        not isinstance(message, dict)
        or message.get("type") != "message"
        or not isinstance(message.get("content"), list)
    ):
        raise malformed(provider, "a body that is not a Messages reply")
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in message["content"]:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use":
            calls.append(_tool_call(block, provider))
        elif kind is None:
            raise malformed(provider, "a content block without a type")
        # thinking and other block types carry nothing an OpenAI client reads
    reply: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        reply["tool_calls"] = calls
    return {
        "id": str(message.get("id") or ""),
        "object": "chat.completion",
        "created": created,
        "model": str(message.get("model") or ""),
        "choices": [
            {"index": 0, "message": reply, "logprobs": None, "finish_reason": finish(message.get("stop_reason"))}
        ],
        "usage": usage(message.get("usage"), provider),
    }


def finish(stop_reason: Any) -> str | None:
    if stop_reason is None:
        return None
    return FINISH_REASONS.get(str(stop_reason), "stop")


def usage(raw: Any, provider: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise malformed(provider, "a reply without usage")
    counts = {}
    for name in ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
        value = raw.get(name) or 0
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise malformed(provider, f"usage.{name} that is not a count")
        counts[name] = value
    prompt = counts["input_tokens"] + counts["cache_read_input_tokens"] + counts["cache_creation_input_tokens"]
    return {
        "prompt_tokens": prompt,
        "completion_tokens": counts["output_tokens"],
        "total_tokens": prompt + counts["output_tokens"],
        "prompt_tokens_details": {"cached_tokens": counts["cache_read_input_tokens"]},
    }


def _tool_call(block: dict[str, Any], provider: str) -> dict[str, Any]:
    if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
        raise malformed(provider, "a tool_use block without id or name")
    arguments = json.dumps(block.get("input") if isinstance(block.get("input"), dict) else {})
    return {"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": arguments}}


class ChunkTranslator:
    """Messages SSE events in, OpenAI chunk objects out. `done` once `message_stop` arrived."""

    def __init__(self, provider: str, created: int, *, include_usage: bool) -> None:
        self._provider = provider
        self._created = created
        self._include_usage = include_usage
        self._id = ""
        self._model = ""
        self._usage: dict[str, Any] = {}
        self._tool_index: dict[int, int] = {}  # content block index -> OpenAI tool call index
        self.done = False

    def feed(self, event: str, data: Any) -> list[dict[str, Any]]:
        if not isinstance(data, dict):
            raise malformed(self._provider, "a stream event that is not a JSON object")
        kind = data.get("type", event)
        if kind == "error":
            error = data.get("error")
            detail = error.get("message") if isinstance(error, dict) else error
            raise UpstreamError(
                f"cloud provider {self._provider!r} failed mid-stream: {str(detail)[:500]}",
                code=ErrorCode.PROVIDER_STREAM_ERROR,
            )
        handler = getattr(self, f"_on_{kind}", None) if isinstance(kind, str) and kind.isidentifier() else None
        return handler(data) if handler is not None else []  # ping and unknown events carry nothing

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._model,
            "choices": [choice],
        }

    def _on_message_start(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        message = data.get("message")
        if not isinstance(message, dict):
            raise malformed(self._provider, "message_start without a message")
        self._id, self._model = str(message.get("id") or ""), str(message.get("model") or "")
        if isinstance(message.get("usage"), dict):
            self._usage.update(message["usage"])
        return [self._chunk({"role": "assistant", "content": ""})]

    def _on_content_block_start(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        block, index = data.get("content_block"), data.get("index")
        if not isinstance(block, dict) or not isinstance(index, int):
            raise malformed(self._provider, "content_block_start without a block or index")
        if block.get("type") == "tool_use":
            call = _tool_call({**block, "input": {}}, self._provider)
            call["function"]["arguments"] = ""
            self._tool_index[index] = len(self._tool_index)
            return [self._chunk({"tool_calls": [{"index": self._tool_index[index], **call}]})]
        if block.get("type") == "text" and block.get("text"):
            return [self._chunk({"content": block["text"]})]
        return []

    def _on_content_block_delta(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        delta, index = data.get("delta"), data.get("index")
        if not isinstance(delta, dict) or not isinstance(index, int):
            raise malformed(self._provider, "content_block_delta without a delta or index")
        if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
            return [self._chunk({"content": delta["text"]})]
        if delta.get("type") == "input_json_delta" and isinstance(delta.get("partial_json"), str):
            if index not in self._tool_index:
                raise malformed(self._provider, "input_json_delta for a block that is not a tool_use")
            call = {"index": self._tool_index[index], "function": {"arguments": delta["partial_json"]}}
            return [self._chunk({"tool_calls": [call]})]
        return []  # thinking, signature and citation deltas carry nothing an OpenAI client reads

    def _on_message_delta(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        delta = data.get("delta")
        if isinstance(data.get("usage"), dict):
            self._usage.update({k: v for k, v in data["usage"].items() if v is not None})
        reason = finish(delta.get("stop_reason")) if isinstance(delta, dict) else None
        return [self._chunk({}, reason)] if reason is not None else []

    def _on_message_stop(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        self.done = True
        if not self._include_usage:
            return []
        last = self._chunk({})
        last["choices"] = []
        last["usage"] = usage(self._usage, self._provider)
        return [last]
