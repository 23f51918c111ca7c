"""What a model replica hands the gateway (serve_apps/engine/replies.py `plain`, `invalid_body`, called by the
replica's `serve_body`). The values are vLLM's own, made here with its real classes: an `ErrorResponse`, a
whole `ChatCompletionResponse`, a body its `ChatCompletionRequest` refuses. The inconvenient part of the real
thing reproduced: unpickling a vLLM object imports vLLM (and torch) into the process that reads it, so the
plain values are unpickled in a fresh interpreter that must not import either."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest
from pydantic import ValidationError
from ray.serve.llm.openai_api_models import ChatCompletionRequest, ChatCompletionResponse, ErrorResponse
from vllm.entrypoints.serve.engine.protocol import ErrorInfo

from router.errors import ContextLengthExceeded, InvalidRequest
from serve_apps.engine.replies import (
    Complete,
    EngineError,
    EngineFailed,
    engine_failed,
    invalid_body,
    plain,
    to_sse,
    translate_error_response,
)

RESPONSE = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "smollm2-135m-instruct",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Paris."}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12},
}
TOO_LONG = "This model's maximum context length is 2048 tokens. However, you requested 4000 tokens"


def error_response(message: str, code: int, param: str | None = None) -> ErrorResponse:
    return ErrorResponse(error=ErrorInfo(message=message, type="BadRequestError", param=param, code=code))


def test_an_error_response_keeps_what_the_gateway_maps() -> None:
    item = plain(error_response(TOO_LONG, 400, "messages"))
    assert isinstance(item, EngineError)
    error = translate_error_response(item)
    assert type(error) is ContextLengthExceeded and error.message == TOO_LONG and error.param == "messages"


def test_a_whole_response_is_its_json_body() -> None:
    item = plain(ChatCompletionResponse.model_validate(RESPONSE))
    assert isinstance(item, Complete)
    assert item.body["choices"][0]["message"]["content"] == "Paris." and item.body["usage"]["total_tokens"] == 12
    assert to_sse(item).startswith("data: {") and '"Paris."' in to_sse(item)


def test_a_batch_of_sse_text_with_an_error_in_it() -> None:
    batch = plain(["data: {}\n\n", error_response("engine dead", 500)])
    assert batch[0] == "data: {}\n\n" and isinstance(batch[1], EngineError) and batch[1].error.code == 500


@pytest.mark.parametrize(
    ("body", "param"),
    [({"model": "m", "messages": "not a list"}, "messages"), ({"model": "m", "messages": [], "n": "x"}, "n")],
)
def test_a_body_the_engine_refuses_is_a_400_naming_the_field(body: dict, param: str) -> None:
    with pytest.raises(ValidationError) as caught:
        ChatCompletionRequest.model_validate(body)
    error = translate_error_response(invalid_body(caught.value))
    assert type(error) is InvalidRequest and error.status_code == 400
    assert error.param == param and error.message.startswith(f"invalid request: {param}: ")


def test_plain_values_unpickle_without_vllm_or_torch() -> None:
    values = [
        plain(ChatCompletionResponse.model_validate(RESPONSE)),
        plain(["data: {}\n\n", error_response("x", 400, "n")]),
        plain(error_response(TOO_LONG, 400)),
    ]
    program = (
        "import pickle, sys; values = pickle.loads(sys.stdin.buffer.read()); "
        "print(len(values), 'vllm' in sys.modules, 'torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], input=pickle.dumps(values), capture_output=True, timeout=120, check=True
    )
    assert done.stdout.decode().split() == ["3", "False", "False"]


def test_an_engine_exception_reaches_the_gateway_without_vllm() -> None:
    """What the replica raises when its engine died (vLLM's real `EngineDeadError`, raised as serve_body raises
    it): its class name and message, unpickled without vLLM or torch (Ray pickles a raised exception whole)."""
    from vllm.v1.engine.exceptions import EngineDeadError

    with pytest.raises(EngineFailed) as caught:
        try:
            raise EngineDeadError()
        except EngineDeadError as exc:
            raise engine_failed(exc) from None
    program = (
        "import pickle, sys; error = pickle.loads(sys.stdin.buffer.read()); "
        "print(type(error).__name__, 'vllm' in sys.modules, 'torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], input=pickle.dumps(caught.value), capture_output=True, timeout=120, check=True
    )
    assert done.stdout.decode().split() == ["EngineFailed", "False", "False"]
    assert str(caught.value).startswith("EngineDeadError: ")


def test_the_gateway_module_imports_neither_vllm_nor_torch() -> None:
    program = "import sys, serve_apps.gateway; print('vllm' in sys.modules, 'torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, timeout=120, check=True)
    assert done.stdout.decode().split() == ["False", "False"]
