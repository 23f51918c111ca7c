"""`auto` bf16 that fails its start-up numerics check: the replica records the failure and restarts, and the
next start on that CPU goes to float32 at once (serve_apps/engine/startup.py, cluster/precision/memory.py).

On the real stack this path no longer runs on an AMX machine (SmolLM2's bf16 failure there is a shipped
verdict: cluster/precision/known.py), so it is tested here. The fake engine client reproduces what the
check reads from vLLM's AsyncLLM: `generate(prompt, params, request_id)` is an async iterator of
cumulative outputs, the last holding every generated token id in `outputs[0].token_ids`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import cluster.precision.local as precision_local
from cluster.config.numerics import NumericsSettings
from cluster.engine_settings import EngineSettings
from cluster.hardware.cpu_caps import CpuCaps
from cluster.precision.numerics_reference import REFERENCE_FILE
from serve_apps.engine.startup import BIND_ENV, BF16Rejected, EngineSetup

AMX = CpuCaps(
    "GenuineIntel", "Intel(R) Xeon(R) Processor", frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
)
PROMPTS = 8


class Engine:
    """Greedy tokens per prompt: the reference's, or the reference's with `wrong` prompts departing at once."""

    def __init__(self, reference: dict[str, Any], wrong: int) -> None:
        self._answers = {
            tuple(p["prompt_token_ids"]): ([t + 1 for t in p["token_ids"]] if i < wrong else list(p["token_ids"]))
            for i, p in enumerate(reference["prompts"])
        }

    async def generate(self, prompt: dict[str, Any], params: Any, request_id: str) -> AsyncIterator[Any]:
        answer = self._answers[tuple(prompt["prompt_token_ids"])]
        for n in range(1, len(answer) + 1):  # cumulative, as RequestOutputKind.CUMULATIVE is
            await asyncio.sleep(0)
            yield SimpleNamespace(outputs=[SimpleNamespace(token_ids=answer[:n])])


@pytest.fixture
def model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, dict[str, Any]]:
    folder = tmp_path / "model"
    folder.mkdir()
    rows = [{"name": f"p{i}", "prompt_token_ids": [1, 50 + i], "token_ids": [10 + i] * 16} for i in range(PROMPTS)]
    reference = {"version": 1, "max_tokens": 16, "dtype": "float32", "engine": "test", "prompts": rows, "bf16": []}
    (folder / REFERENCE_FILE).write_text(json.dumps(reference))
    monkeypatch.setattr(precision_local, "read_cpu_caps", lambda: AMX)
    monkeypatch.setattr(precision_local, "engine_version", lambda: "test")
    memory_root = tmp_path / "precision"
    monkeypatch.setattr(
        precision_local, "precision_memory", lambda s, c, v: precision_local.PrecisionMemory(memory_root, s, c, v)
    )
    monkeypatch.setenv(BIND_ENV, "0")  # the operator's binding: no cores claimed in a unit test
    return str(folder), reference


def setup_for(source: str) -> EngineSetup:
    settings = EngineSettings("auto", NumericsSettings().model_dump(), 30.0, 1)
    return EngineSetup({}, source, settings)


def test_failed_bf16_is_recorded_and_the_next_start_is_float32(model: tuple[str, dict[str, Any]]) -> None:
    source, reference = model
    first = setup_for(source)
    assert first.prepare() == {"dtype": "bfloat16", "enforce_eager": False}
    with pytest.raises(BF16Rejected, match="restarts in float32"):
        asyncio.run(first.verify(Engine(reference, wrong=3)))
    second = setup_for(source)
    assert second.prepare() == {"dtype": "float32", "enforce_eager": True}
    assert any("bf16 failed the numerics check" in note for note in second.notes), second.notes
    assert asyncio.run(second.verify(Engine(reference, wrong=0))).routable


def test_bf16_that_passes_stays_bf16(model: tuple[str, dict[str, Any]]) -> None:
    source, reference = model
    setup = setup_for(source)
    setup.prepare()
    assert asyncio.run(setup.verify(Engine(reference, wrong=1))).routable  # one near tie is allowed in bf16
    assert setup_for(source).prepare()["dtype"] == "bfloat16"


def test_a_float32_failure_is_not_a_bf16_verdict(model: tuple[str, dict[str, Any]]) -> None:
    source, reference = model
    setup = EngineSetup({}, source, EngineSettings("float32", NumericsSettings().model_dump(), 30.0, 1))
    setup.prepare()
    verdict = asyncio.run(setup.verify(Engine(reference, wrong=1)))
    assert not verdict.routable  # float32 allows no departure; the replica stays out of routing, no restart
    assert setup_for(source).prepare()["dtype"] == "bfloat16"
