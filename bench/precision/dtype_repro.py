"""Minimal reproduction: SmolLM2 in bf16 on vLLM-CPU answers garbage in eager mode (docs/dtype.md).

    python -m bench.precision.dtype_repro                 # every variant, one engine process each
    python -m bench.precision.dtype_repro --variant bf16-eager

Each variant is vLLM's offline `LLM` (no Ray, no server, one process) asked "What is the capital
of France?" at temperature 0 with the prepared SmolLM2 folder (`spillover models prepare
smollm2-135m-instruct`). Variants differ only in dtype, `enforce_eager` and vLLM's
`compilation_config.custom_ops` (which CustomOps run their own CPU kernels instead of the
PyTorch-native code):

    fp32-eager                   float32, eager                       → Paris
    bf16-eager                   bfloat16, eager (custom ops: all)    → garbage
    bf16-eager-native-ops        bfloat16, eager, custom ops: none    → Paris
    bf16-eager-no-rope-kernel    bfloat16, eager, all but rotary_embedding → Paris
    bf16-compiled                bfloat16, torch.compile (vLLM's default: custom ops none) → Paris

It starts vLLM, so on a shared machine run it under the lock the project's tests use.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm.renderers.chat_utils import ChatCompletionMessageParam

QUESTION = "What is the capital of France?"
VARIANTS: dict[str, dict[str, Any]] = {
    "fp32-eager": {"dtype": "float32", "enforce_eager": True},
    "bf16-eager": {"dtype": "bfloat16", "enforce_eager": True},
    "bf16-eager-native-ops": {"dtype": "bfloat16", "enforce_eager": True, "custom_ops": ["none"]},
    "bf16-eager-no-rope-kernel": {
        "dtype": "bfloat16",
        "enforce_eager": True,
        "custom_ops": ["all", "-rotary_embedding"],
    },
    "bf16-compiled": {"dtype": "bfloat16", "enforce_eager": False},
}


def run_variant(name: str, model: str) -> dict[str, Any]:
    """In this process: start the engine, ask, return what it said (and how long start-up took)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # one process: the smallest reproduction
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
    from vllm import LLM, SamplingParams

    variant = dict(VARIANTS[name])
    custom_ops = variant.pop("custom_ops", None)
    compilation = {"custom_ops": custom_ops} if custom_ops else None  # None: vLLM's default
    began = time.perf_counter()
    llm = LLM(model, max_model_len=1024, compilation_config=compilation, **variant)
    start_s = time.perf_counter() - began
    conversation: list[ChatCompletionMessageParam] = [{"role": "user", "content": QUESTION}]
    out = llm.chat([conversation], SamplingParams(temperature=0, max_tokens=16))
    text = out[0].outputs[0].text
    return {"variant": name, "start_s": round(start_s, 1), "answer": text, "paris": "paris" in text.lower()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.precision.dtype_repro", description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=sorted(VARIANTS), action="append", help="default: all")
    parser.add_argument("--model", default=None, help="model folder (default: the prepared SmolLM2)")
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.model is None:
        from cluster.models import model_dir

        args.model = str(model_dir("smollm2-135m-instruct"))
    names = args.variant or list(VARIANTS)
    if args.in_process:
        print("RESULT " + json.dumps(run_variant(names[0], args.model)), flush=True)
        return 0
    for name in names:  # one engine per process: vLLM keeps global state
        cmd = [
            sys.executable,
            "-m",
            "bench.precision.dtype_repro",
            "--in-process",
            "--variant",
            name,
            "--model",
            args.model,
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            print(f"{name:28s} failed (exit {done.returncode}): {done.stderr.strip()[-300:]}")
            continue
        result = json.loads(line.removeprefix("RESULT "))
        verdict = "Paris" if result["paris"] else "WRONG"
        print(f"{name:28s} {verdict:6s} start {result['start_s']:6.1f}s  {result['answer']!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
