"""The one error hierarchy of spillover.

Every failure a user or an operator can meet is one of these classes. Errors from
libraries (pydantic, httpx, Ray, vLLM) are translated into them at the boundary that
calls the library; nothing else in the code base raises bare library errors upward.

    SpilloverError                     base; carries a human message
    ├── ConfigError                    a config file is invalid (file, field path, reason)
    ├── ModelPrepareError              `spillover models prepare` could not build a model
    ├── ClusterError                   Ray / Serve could not be started or reached
    └── RequestError                   answered to an HTTP client in the OpenAI error shape
        ├── InvalidRequest       400   malformed JSON, missing/invalid fields
        │   └── ContextLengthExceeded  400  prompt + max_tokens beyond the model's window
        ├── ModelNotFound        404   the requested model alias is not configured
        └── UpstreamError        502   a local engine failed while serving the request
            └── TargetUnavailable 503  no healthy target can take the request now

`RequestError.to_openai()` renders the body `{"error": {"message", "type", "param",
"code"}}` that OpenAI clients understand.
"""

from __future__ import annotations

from typing import Any


class SpilloverError(Exception):
    """Base of every error spillover raises on purpose."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigError(SpilloverError):
    """A config file failed validation.

    `problems` holds one `(field_path, reason)` pair per problem found.
    """

    def __init__(self, path: str, problems: list[tuple[str, str]]) -> None:
        self.path = path
        self.problems = problems
        lines = [f"invalid config {path}:"]
        lines += [f"  {field}: {reason}" for field, reason in problems]
        super().__init__("\n".join(lines))


class ModelPrepareError(SpilloverError):
    """A model folder could not be built."""


class ClusterError(SpilloverError):
    """Ray or Ray Serve could not be started, reached or deployed to."""


class RequestError(SpilloverError):
    """An error answered to an HTTP client."""

    status_code: int = 400
    error_type: str = "invalid_request_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        if code is not None:
            self.code = code

    def to_openai(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


class InvalidRequest(RequestError):
    status_code = 400
    code = "invalid_request"


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"


class ModelNotFound(RequestError):
    status_code = 404
    code = "model_not_found"


class UpstreamError(RequestError):
    status_code = 502
    error_type = "upstream_error"
    code = "upstream_error"


class TargetUnavailable(UpstreamError):
    status_code = 503
    code = "target_unavailable"
