"""What a client and the health view learn when a model replica's call fails (serve_apps/engine/local_backend.py).

The fake handle reproduces Ray Serve's: `options(stream=True).serve_body.remote()` returns a response
generator whose `__anext__` raises what the replica raised, wrapped by Ray as `RayTaskError(<its class>)` with
the original as `.cause` (RayTaskError.as_instanceof_cause, as Ray builds it), and which has `cancel()`."""

from __future__ import annotations

from typing import Any

import pytest
from ray.exceptions import RayActorError, RayError, RayTaskError

from router.errors import TargetUnavailable
from serve_apps.engine.local_backend import ServeHandleBackend, ray_reason
from serve_apps.engine.replies import EngineFailed

TRACEBACK = 'Traceback (most recent call last):\n  File "/home/ops/.venv/lib/python3.11/site-packages/x.py", line 1'


def task_error(cause: Exception) -> RayError:
    error: RayError = RayTaskError("serve_body", TRACEBACK, cause).as_instanceof_cause()
    return error


DEAD = task_error(EngineFailed("EngineDeadError: engine died"))


class _Responses:
    def __init__(self, error: RayError) -> None:
        self._error = error

    async def __anext__(self) -> Any:
        raise self._error

    def cancel(self) -> None:
        pass


class _Method:
    def __init__(self, error: RayError) -> None:
        self._error = error

    def remote(self, *args: Any) -> Any:
        return _Responses(self._error)


class _Failing:
    """A plain call's DeploymentResponse: awaiting it raises what the replica raised."""

    def __init__(self, error: RayError) -> None:
        self._error = error

    def remote(self, *args: Any) -> Any:
        return self._fail()

    async def _fail(self) -> Any:
        raise self._error


class _Handle:
    def __init__(self, error: RayError) -> None:
        self.serve_body = _Method(error)
        self.check_health = _Failing(error)

    def options(self, **_: Any) -> _Handle:
        return self


def test_the_engines_own_error_is_named_and_rays_traceback_is_not() -> None:
    reason = ray_reason(task_error(EngineFailed("EngineDeadError: EngineCore encountered an issue")))
    assert reason == "RayTaskError(EngineFailed): EngineDeadError: EngineCore encountered an issue"
    assert ray_reason(RayActorError()) == "RayActorError"  # no actor ids, no addresses
    assert "Traceback" not in ray_reason(task_error(ValueError("x" * 5000)))


async def test_a_dead_engine_before_the_first_byte_is_a_503_saying_why() -> None:
    backend = ServeHandleBackend({"m": _Handle(DEAD)})  # type: ignore[dict-item]
    with pytest.raises(TargetUnavailable) as caught:
        await backend.call("m", "chat", {"messages": []}, "r1")
    assert caught.value.message == "model 'm' is unavailable: RayTaskError(EngineFailed): EngineDeadError: engine died"
    assert "/home/ops" not in caught.value.message


async def test_the_health_check_says_why_too() -> None:
    backend = ServeHandleBackend({"m": _Handle(DEAD)})  # type: ignore[dict-item]
    said = await backend.check_health("m", 1.0)
    assert said == "unhealthy: RayTaskError(EngineFailed): EngineDeadError: engine died"
