"""A model's shape: the numbers of its config.json that set its weights' and KV cache's size.

`ModelShape` holds them: layers, attention and KV heads, head_dim, hidden and MLP widths, vocab,
tied embeddings, attention biases, and the weights' and KV cache's dtypes. It is derived from a
Hugging Face config.json (`ModelShape.from_hf_config`, or `load_model_shape` for a file or folder):

    head_dim   = head_dim or hidden_size // num_attention_heads
    kv heads   = num_key_value_heads or num_attention_heads
    dtype      = torch_dtype or dtype (float32 when absent, as in HF); vLLM's dtype /
                 kv_cache_dtype engine args override it (`ModelShape.with_dtypes`)
    kv bytes / token = 2 (K and V) × num_layers × num_kv_heads × head_dim × bytes(kv dtype)
    params     = estimated from the shape (`estimate_param_count`); weights = params × bytes(dtype)

Multimodal wrappers are read through their `text_config`. `LLAMA_3_1_8B`, `QWEN2_5_7B` and
`SMOLLM2_135M` are the config.json fields of three real models. Everything is pure except
`load_hf_config`, which reads a file. `cluster.capacity.memory` turns a shape into a concurrency estimate.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from router.errors import ConfigError

DTYPE_BYTES: Mapping[str, int] = MappingProxyType(
    {
        "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2,
        "float32": 4, "fp32": 4, "float": 4,
        "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
    }
)  # fmt: skip

# Shapes of three real models, copied from their Hugging Face config.json files.
LLAMA_3_1_8B: Mapping[str, Any] = MappingProxyType(
    {
        "architectures": ("LlamaForCausalLM",), "model_type": "llama",
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
        "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }
)  # fmt: skip
QWEN2_5_7B: Mapping[str, Any] = MappingProxyType(
    {
        "architectures": ("Qwen2ForCausalLM",), "model_type": "qwen2",
        "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
        "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }
)  # fmt: skip
SMOLLM2_135M: Mapping[str, Any] = MappingProxyType(
    {
        "architectures": ("LlamaForCausalLM",), "model_type": "llama",
        "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
        "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "rope_theta": 100000.0,
        "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    }
)  # fmt: skip


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a torch/vLLM dtype name ("bfloat16", "torch.float16", "fp8", ...)."""
    key = str(dtype).lower().removeprefix("torch.")
    if key not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(sorted(DTYPE_BYTES))}")
    return DTYPE_BYTES[key]


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """2 (K and V) × layers × KV heads × head_dim × bytes per element."""
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


@dataclass(frozen=True)
class ModelShape:
    """What the capacity model needs from a model's config.json.

    `dtype` is the weights' dtype; `kv_dtype` the KV cache's (the same unless vLLM's
    kv_cache_dtype says otherwise). `param_count` is an estimate from the shape (see
    `estimate_param_count`), used for the weights' bytes when none are given.
    """

    name: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    attention_bias: bool
    dtype: str
    kv_dtype: str

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any], name: str = "") -> ModelShape:
        """Build from a Hugging Face config.json mapping; ValueError names every missing field.

        head_dim = head_dim or hidden_size // num_attention_heads; KV heads = num_key_value_heads
        or num_attention_heads; dtype from torch_dtype/dtype (float32 when absent, as in HF);
        q/k/v biases when attention_bias is set, and always for model_type qwen2.
        """
        if "num_hidden_layers" not in config and isinstance(config.get("text_config"), Mapping):
            config = config["text_config"]  # multimodal wrappers nest the language model
        required = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
        missing = [key for key in required if not isinstance(config.get(key), int) or config[key] <= 0]
        if missing:
            raise ValueError(f"config is missing positive integer field(s): {', '.join(missing)}")
        heads = int(config["num_attention_heads"])
        head_dim = int(config.get("head_dim") or config["hidden_size"] // heads)
        dtype = str(config.get("torch_dtype") or config.get("dtype") or "float32").removeprefix("torch.")
        dtype_bytes(dtype)  # validate early
        bias = config.get("attention_bias")
        return cls(
            name=name or str(config.get("_name_or_path") or config.get("model_type") or "model"),
            num_layers=int(config["num_hidden_layers"]),
            num_attention_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            hidden_size=int(config["hidden_size"]),
            intermediate_size=int(config["intermediate_size"]),
            vocab_size=int(config["vocab_size"]),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            attention_bias=bool(bias) if bias is not None else config.get("model_type") == "qwen2",
            dtype=dtype,
            kv_dtype=dtype,
        )

    def with_dtypes(self, dtype: str | None = None, kv_cache_dtype: str | None = None) -> ModelShape:
        """Apply vLLM's `dtype` / `kv_cache_dtype` engine args ("auto" or None keep the model's)."""
        weights = self.dtype if dtype in (None, "auto") else str(dtype).removeprefix("torch.")
        kv = weights if kv_cache_dtype in (None, "auto") else str(kv_cache_dtype)
        dtype_bytes(weights), dtype_bytes(kv)  # validate
        return replace(self, dtype=weights, kv_dtype=kv)

    @property
    def kv_bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim, dtype_bytes(self.kv_dtype))

    @property
    def param_count(self) -> int:
        return estimate_param_count(self)

    @property
    def weights_bytes(self) -> int:
        return self.param_count * dtype_bytes(self.dtype)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "kv_bytes_per_token": self.kv_bytes_per_token, "param_count": self.param_count}


def estimate_param_count(shape: ModelShape) -> int:
    """Parameters of a Llama/Qwen2-style decoder, from its shape.

    embedding V×h; per layer: q h×(n·d) + k,v 2×h×(n_kv·d) + o (n·d)×h [+ q/k/v biases n·d + 2·n_kv·d],
    gated MLP 3×h×i, two RMSNorms 2h; final norm h; lm_head V×h unless tied.
    (Llama-3.1-8B → 8,030,261,248; Qwen2.5-7B → 7,615,616,512; SmolLM2-135M → 134,515,008.)
    """
    h, d = shape.hidden_size, shape.head_dim
    q_width, kv_width = shape.num_attention_heads * d, shape.num_kv_heads * d
    attention = h * q_width + 2 * h * kv_width + q_width * h
    if shape.attention_bias:
        attention += q_width + 2 * kv_width
    per_layer = attention + 3 * h * shape.intermediate_size + 2 * h
    embedding = shape.vocab_size * h
    lm_head = 0 if shape.tie_word_embeddings else embedding
    return embedding + shape.num_layers * per_layer + h + lm_head


def load_hf_config(path: str | Path) -> dict[str, Any]:
    """Read a config.json (or the config.json inside a folder); ConfigError names the file."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(str(path), [("(file)", exc.strerror or str(exc))]) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(str(path), [(f"line {exc.lineno}", f"not valid JSON: {exc.msg}")]) from None
    if not isinstance(data, dict):
        raise ConfigError(str(path), [("(top level)", "expected a JSON object")])
    return data


def load_model_shape(path: str | Path, name: str = "") -> ModelShape:
    """`ModelShape` of the model whose config.json is at `path` (a file or its folder)."""
    config = load_hf_config(path)
    try:
        return ModelShape.from_hf_config(config, name=name or Path(path).name)
    except ValueError as exc:
        raise ConfigError(str(path), [("(model shape)", str(exc))]) from None
