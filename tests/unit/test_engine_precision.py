"""The CPU a vLLM-CPU engine runs on, and the precision chosen for it (cluster/hardware/cpu_caps.py,
cluster/precision/choice.py, cluster/precision/memory.py).

The /proc/cpuinfo texts are trimmed copies of the two CPUs machines of this kind come with: an Intel
Xeon with AMX-BF16 and AVX512-BF16 and an AMD EPYC with AVX2 only."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.hardware.cpu_caps import CpuCaps, parse_cpuinfo, read_cpu_caps
from cluster.precision.choice import choose
from cluster.precision.memory import PrecisionMemory

INTEL = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw avx512_bf16 amx_bf16 amx_tile amx_int8

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw avx512_bf16 amx_bf16 amx_tile amx_int8
"""
AMD = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13 64-Core Processor
flags\t\t: fpu sse2 avx avx2 fma bmi2 sha_ni
"""


def test_cpu_class_of_the_two_cpus_of_this_kind() -> None:
    intel, amd = parse_cpuinfo(INTEL), parse_cpuinfo(AMD)
    assert intel.cpu_class == "amx-bf16" and intel.native_bf16
    assert amd.cpu_class == "avx2" and not amd.native_bf16
    assert "AMD EPYC" in amd.describe() and "avx2" in amd.describe()
    assert intel.signature != amd.signature and intel.signature == parse_cpuinfo(INTEL).signature


@pytest.mark.parametrize(
    ("flags", "cls"),
    [
        ("avx512f avx512_bf16", "avx512-bf16"),
        ("avx512f avx2", "avx512"),
        ("amx_bf16 avx2", "avx2"),  # AMX-BF16 without tiles is not usable AMX
        ("sse2", "other"),
    ],
)
def test_cpu_classes(flags: str, cls: str) -> None:
    assert CpuCaps("v", "m", frozenset(flags.split())).cpu_class == cls


def test_unreadable_cpuinfo_is_a_cpu_without_flags(tmp_path: Path) -> None:
    caps = read_cpu_caps(tmp_path / "missing")
    assert caps.cpu_class == "other" and not caps.native_bf16


def test_auto_takes_bf16_compiled_only_where_native() -> None:
    intel = choose("auto", {}, parse_cpuinfo(INTEL), None)
    assert (intel.dtype, intel.compiled, intel.auto) == ("bfloat16", True, True)
    amd = choose("auto", {}, parse_cpuinfo(AMD), None)
    assert amd.dtype == "float32" and "no native bf16" in amd.reason and "AMD EPYC" in amd.reason


def test_auto_remembers_a_failed_bf16_check() -> None:
    chosen = choose("auto", {}, parse_cpuinfo(INTEL), "3/8 prompts agree")
    assert chosen.dtype == "float32" and "3/8 prompts agree" in chosen.reason and chosen.auto


def test_explicit_choices_win() -> None:
    amd = parse_cpuinfo(AMD)
    assert choose("auto", {"dtype": "bfloat16"}, amd, None).dtype == "bfloat16"  # the operator's
    assert not choose("auto", {"dtype": "bfloat16"}, amd, None).auto
    assert choose("float32", {}, parse_cpuinfo(INTEL), None).dtype == "float32"
    forced = choose("bfloat16", {}, amd, None)
    assert (forced.dtype, forced.compiled) == ("bfloat16", True)  # bf16 eager answers garbage on vLLM-CPU 0.32


def test_engine_kwargs_keep_an_explicit_enforce_eager() -> None:
    chosen = choose("float32", {"enforce_eager": True}, parse_cpuinfo(INTEL), None)
    assert chosen.engine_kwargs({"enforce_eager": True, "max_model_len": 64}) == {
        "enforce_eager": True,
        "max_model_len": 64,
        "dtype": "float32",
    }
    assert choose("auto", {}, parse_cpuinfo(INTEL), None).engine_kwargs({})["enforce_eager"] is False


def test_precision_memory_is_per_cpu_model_and_engine(tmp_path: Path) -> None:
    intel, amd = parse_cpuinfo(INTEL), parse_cpuinfo(AMD)
    memory = PrecisionMemory(tmp_path, "/models/smol", intel, "0.32.0")
    assert memory.bf16_failed() is None
    memory.record_bf16_failure("4/8 prompts agree")
    assert PrecisionMemory(tmp_path, "/models/smol", intel, "0.32.0").bf16_failed() == "4/8 prompts agree"
    assert PrecisionMemory(tmp_path, "/models/smol", amd, "0.32.0").bf16_failed() is None
    assert PrecisionMemory(tmp_path, "/models/other", intel, "0.32.0").bf16_failed() is None
    assert PrecisionMemory(tmp_path, "/models/smol", intel, "0.33.0").bf16_failed() is None


def test_precision_memory_ignores_a_corrupt_file(tmp_path: Path) -> None:
    memory = PrecisionMemory(tmp_path, "/m", parse_cpuinfo(INTEL), "v")
    memory.path.write_text("{not json")
    assert memory.bf16_failed() is None


def test_float32_runs_eager_unless_asked_to_compile() -> None:
    """Compiled float32 decoded no faster than eager on vLLM-CPU 0.32 and starts a minute later."""
    amd = parse_cpuinfo(AMD)
    eager = choose("auto", {}, amd, None)
    assert (eager.dtype, eager.compiled, eager.label) == ("float32", False, "float32 eager")
    assert eager.engine_kwargs({})["enforce_eager"] is True
    compiled = choose("auto", {"enforce_eager": False}, amd, None)
    assert compiled.label == "float32 compiled" and compiled.engine_kwargs({"enforce_eager": False}) == {
        "enforce_eager": False,
        "dtype": "float32",
    }
    assert choose("float32", {}, parse_cpuinfo(INTEL), None).label == "float32 eager"
