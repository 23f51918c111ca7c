"""How each precision of a vLLM-CPU engine computes and how fast it decodes, on this machine's CPU.

    python -m bench.precision.matrix [--variant fp32-eager ...] [--threads 1] [--emulate-avx2] [--out DIR]

One engine per process (vLLM's offline `LLM`, its engine core and worker in processes of their own
as in a Serve replica, the worker's OpenMP threads bound to `--threads` cores), for each variant:

* numerics: the model's float32 reference prompts (cluster/precision/numerics_reference.py, written by
  `spillover models prepare`) at temperature 0 — how many leading tokens of each agree with the
  reference, and the verdict of the numerics check (cluster/precision/numerics_check.py) with the config's
  defaults (models[].numerics);
* speed: a ~300-token prompt decoding 64 tokens (ignore_eos) at concurrency 1 and 4, output tokens/s.

`--emulate-avx2` makes this process take the paths vLLM-CPU and PyTorch take on a CPU without AVX-512
or AMX (vLLM's `_C_AVX2` kernels, its `vec` attention, ATEN_CPU_CAPABILITY=avx2,
ONEDNN_MAX_CPU_ISA=AVX2): an approximation of an AVX2-only machine on this one, never a substitute
for measuring there. Results print as a table and, with --out, go to `precision-matrix.json`. It
starts vLLM, so on a shared machine run it under the lock the project's tests use.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm.inputs import TokensPrompt

VARIANTS: dict[str, dict[str, Any]] = {
    "fp32-eager": {"dtype": "float32", "enforce_eager": True},
    "fp32-compiled": {"dtype": "float32", "enforce_eager": False},
    "bf16-eager": {"dtype": "bfloat16", "enforce_eager": True},
    "bf16-compiled": {"dtype": "bfloat16", "enforce_eager": False},
}
EMULATE_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def _emulate_avx2() -> None:
    """Before vLLM is imported: PyTorch reports no AVX-512 / AMX, so vLLM loads its AVX2 kernels."""
    import torch

    for name in ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        setattr(torch.cpu, name, lambda: False)
    torch._C._cpu._is_amx_tile_supported = lambda: False  # type: ignore[attr-defined]  # torch/_C/_cpu.pyi omits it


def run_variant(name: str, folder: str, emulate: bool) -> dict[str, Any]:
    """In this process: one engine, its agreement with the reference and its decode speed."""
    if emulate:
        _emulate_avx2()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
    os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")
    from vllm import LLM, SamplingParams

    from cluster.config.numerics import NumericsSettings
    from cluster.precision.numerics_check import agreeing_prefix, judge
    from cluster.precision.numerics_reference import load_reference

    reference = load_reference(Path(folder))
    if reference is None:
        raise SystemExit(f"{folder} has no numerics reference: run `spillover models prepare`")
    began = time.perf_counter()
    llm = LLM(folder, max_model_len=2048, enable_prefix_caching=True, **VARIANTS[name])
    start_s = time.perf_counter() - began
    prompts: list[TokensPrompt] = [{"prompt_token_ids": p["prompt_token_ids"]} for p in reference["prompts"]]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=int(reference["max_tokens"])))
    got = [list(o.outputs[0].token_ids) for o in outs]
    settings = NumericsSettings()
    dtype = VARIANTS[name]["dtype"]
    verdict = judge(
        reference, got, first_tokens=settings.first_tokens, min_agreeing=settings.min_agreeing(dtype), label=dtype
    )
    base = reference["prompts"][-1]["prompt_token_ids"][:300]
    speed = {}
    for concurrency in (1, 4):
        batch: list[TokensPrompt] = [
            {"prompt_token_ids": [1000 + i + 10 * concurrency, *base[1:]]} for i in range(concurrency)
        ]
        t = time.perf_counter()
        done = llm.generate(batch, SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))
        speed[str(concurrency)] = round(sum(len(x.outputs[0].token_ids) for x in done) / (time.perf_counter() - t), 1)
    return {
        "variant": name,
        "emulate_avx2": emulate,
        "threads_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto"),
        "start_s": round(start_s, 1),
        "agreement": [agreeing_prefix(p["token_ids"], g) for p, g in zip(reference["prompts"], got, strict=True)],
        "verdict": verdict.state,
        "tok_s": speed,
        "capital": outs[0].outputs[0].text,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.precision.matrix", description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=sorted(VARIANTS), action="append", help="default: all")
    parser.add_argument("--model", default=None, help="model folder (default: the prepared SmolLM2)")
    parser.add_argument("--threads", default="0", help="VLLM_CPU_OMP_THREADS_BIND for the worker (default: core 0)")
    parser.add_argument("--emulate-avx2", action="store_true", help="take the AVX2-only kernels (see above)")
    parser.add_argument("--out", default=None, help="folder for precision-matrix.json")
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.model is None:
        from cluster.models import model_dir

        args.model = str(model_dir("smollm2-135m-instruct"))
    names = args.variant or list(VARIANTS)
    if args.in_process:
        print("RESULT " + json.dumps(run_variant(names[0], args.model, args.emulate_avx2)), flush=True)
        return 0
    from cluster.hardware.cpu_caps import read_cpu_caps
    from cluster.models import compile_cache_dir

    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": args.threads}
    env.setdefault("VLLM_CACHE_ROOT", str(compile_cache_dir()))
    if args.emulate_avx2:
        env.update(EMULATE_ENV)
    caps = read_cpu_caps()
    print(f"CPU: {caps.describe()}; worker threads bound to {args.threads}; emulate AVX2: {args.emulate_avx2}")
    results = []
    for name in names:  # one engine per process: vLLM keeps global state
        cmd = [sys.executable, "-m", "bench.precision.matrix", "--in-process", "--variant", name, "--model", args.model]
        cmd += ["--emulate-avx2"] if args.emulate_avx2 else []
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
        line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            print(f"{name:14s} failed (exit {done.returncode}): {done.stderr.strip()[-300:]}")
            continue
        result = json.loads(line.removeprefix("RESULT "))
        results.append(result)
        print(
            f"{name:14s} {result['verdict']:7s} agreement {result['agreement']}  start {result['start_s']:5.1f}s  "
            f"tok/s c=1 {result['tok_s']['1']:6.1f}  c=4 {result['tok_s']['4']:6.1f}  {result['capital']!r}"
        )
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        data = {"cpu": caps.to_dict(), "threads_bind": args.threads, "emulate_avx2": args.emulate_avx2}
        data["results"] = results
        (out / "precision-matrix.json").write_text(json.dumps(data, indent=1) + "\n")
    return 0 if results else 1


if __name__ == "__main__":
    sys.exit(main())
