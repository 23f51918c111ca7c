"""The bf16 verdicts the project ships (cluster/precision/known.py): `auto` takes float32 at once where the
model's numerics check was measured to fail in bf16 on the CPU class and engine version, and only there."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import cluster.precision.local as precision_local
from cluster.config.numerics import NumericsSettings
from cluster.hardware.cpu_caps import CpuCaps
from cluster.precision.known import KnownBf16Failure, known_bf16_failure, reference_digest

AMX = CpuCaps(
    "GenuineIntel", "Intel(R) Xeon(R) Processor", frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
)
AVX512_BF16 = CpuCaps("GenuineIntel", "Intel(R) Xeon(R) Processor", frozenset({"avx2", "avx512f", "avx512_bf16"}))


def reference(first: int = 7) -> dict[str, Any]:
    rows = [{"name": f"p{i}", "prompt_token_ids": [1, 2, i], "token_ids": [first, i, 9]} for i in range(3)]
    return {"version": 1, "max_tokens": 3, "prompts": rows, "bf16": []}


def known_for(ref: dict[str, Any]) -> tuple[KnownBf16Failure, ...]:
    digest = reference_digest(ref)
    assert digest is not None
    return (KnownBf16Failure(digest, "test model", "amx-bf16", "0.32.0", "4 of 8 agree"),)


def test_a_known_failure_matches_model_class_and_engine() -> None:
    known = known_for(reference())
    why = known_bf16_failure(reference(), AMX, "0.32.0", known)
    assert why is not None and "amx-bf16" in why and "0.32.0" in why and "4 of 8 agree" in why


@pytest.mark.parametrize(
    ("ref", "caps", "engine"),
    [
        (reference(first=8), AMX, "0.32.0"),  # other float32 answers: another model (or weights)
        (reference(), AVX512_BF16, "0.32.0"),  # another CPU class: not measured there
        (reference(), AMX, "0.33.0"),  # another engine: its kernels may be right
        (None, AMX, "0.32.0"),  # no reference
        ({"prompts": []}, AMX, "0.32.0"),
        ({"prompts": [{"token_ids": [1]}]}, AMX, "0.32.0"),  # a reference missing fields
        ({"prompts": "x"}, AMX, "0.32.0"),
    ],
)
def test_anything_else_is_not_known(ref: dict[str, Any] | None, caps: CpuCaps, engine: str) -> None:
    assert known_bf16_failure(ref, caps, engine, known_for(reference())) is None


def test_the_digest_is_of_prompts_and_float32_tokens_only() -> None:
    a, b = reference(), reference()
    b["engine"] = "transformers 9"
    b["prompts"][0]["text"] = "other text"
    assert reference_digest(a) == reference_digest(b)
    b["prompts"][0]["token_ids"] = [0]
    assert reference_digest(a) != reference_digest(b)


def test_local_choice_takes_float32_at_once_for_a_known_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    ref = reference()
    (folder / "numerics-reference.json").write_text(json.dumps(ref))
    monkeypatch.setattr(precision_local, "engine_version", lambda: "0.32.0")
    monkeypatch.setattr(
        precision_local, "known_bf16_failure", lambda r, c, v: known_bf16_failure(r, c, v, known_for(ref))
    )
    monkeypatch.setattr(
        precision_local, "precision_memory", lambda s, c, v: precision_local.PrecisionMemory(tmp_path / "mem", s, c, v)
    )
    numerics = NumericsSettings()
    choice = precision_local.local_choice("auto", {}, str(folder), numerics, AMX)[0]
    assert (choice.dtype, choice.compiled, choice.auto) == ("float32", False, True)
    assert "measured by the project on amx-bf16" in choice.reason
    # the operator's explicit bf16 still runs bf16 (and its check)
    assert precision_local.local_choice("bfloat16", {}, str(folder), numerics, AMX)[0].dtype == "bfloat16"
    # on the class not measured, auto still tries bf16
    assert precision_local.local_choice("auto", {}, str(folder), numerics, AVX512_BF16)[0].dtype == "bfloat16"


def test_the_shipped_digests_are_well_formed() -> None:
    from cluster.precision.known import KNOWN_BF16_FAILURES

    for entry in KNOWN_BF16_FAILURES:
        assert len(entry.reference_digest) == 16 and int(entry.reference_digest, 16) >= 0
        assert entry.engine.count(".") == 2
