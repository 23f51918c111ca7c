"""The float32 reference a served model's numerics are checked against (cluster/precision/numerics_check.py).

When a catalog model is prepared (`spillover models prepare`), the same weights are run once more in
float32 by transformers — the slow, plain implementation with no custom kernels — and the greedy tokens
for a fixed set of prompts are written next to the weights:

    <model folder>/numerics-reference.json
        {"version": 1, "max_tokens": 16, "dtype": "float32", "engine": "transformers <version>",
         "prompts": [{"name": ..., "messages": [...], "prompt_token_ids": [...], "token_ids": [...],
                      "text": ...}, ...]}

The prompts are chat-templated here, once, and the engine is later given the very same token ids, so
the check compares numerics alone: no tokenizer, template or sampling difference can enter. What the
model *knows* does not matter either: a weak model's greedy tokens are as reproducible as a strong
one's, and a wrong kernel or dtype changes them within a few tokens.

The same weights are also run in bfloat16 by transformers (`"bf16"`: its greedy tokens and how many
leading tokens agree with float32 per prompt). That measures the *model's* sensitivity to bf16
rounding, whatever the CPU: where even the reference implementation's bf16 departs from float32 on
more prompts than `models[].numerics.min_agreeing_bf16` allows, `precision: auto` never chooses bf16
for the model (cluster/precision/choice.py), since a bf16 engine could not be told from a broken one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

REFERENCE_FILE = "numerics-reference.json"
REFERENCE_VERSION = 1
MAX_TOKENS = 16

# Short and long, factual and not, prose, code and numbers: different paths through attention
# (the long one spans several KV blocks) and different token statistics.
_LONG_CONTEXT = " ".join(
    f"Station {i} records a temperature of {10 + (i * 7) % 23} degrees and {i * 3 % 11} millimetres of rain."
    for i in range(1, 25)
)
PROMPTS: tuple[tuple[str, str], ...] = (
    ("capital", "What is the capital of France?"),
    ("list", "Name three primary colours."),
    ("arithmetic", "What is 12 plus 30? Answer with the number."),
    ("code", "Write a Python function that returns the square of a number."),
    ("story", "Tell me a short story about a robot who learns to paint."),
    ("define", "Explain in one sentence what photosynthesis is."),
    ("translate", "Translate 'good morning' into Spanish."),
    ("long", f"Here are some weather readings. {_LONG_CONTEXT} Which station recorded the most rain?"),
)

Progress = Callable[[str], None]


def reference_path(folder: Path) -> Path:
    return folder / REFERENCE_FILE


def load_reference(folder: Path) -> dict[str, Any] | None:
    """The folder's reference, or None when it has none (or one of another version)."""
    path = reference_path(folder)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("version") != REFERENCE_VERSION or not data.get("prompts"):
        return None
    return data


def build_reference(folder: Path, progress: Progress = lambda _: None) -> dict[str, Any]:
    """Run the folder's model in float32 with transformers and write its greedy tokens (returns them)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cluster.precision.numerics_check import agreeing_prefix

    tokenizer = AutoTokenizer.from_pretrained(folder)
    models = {
        dtype: AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
        for dtype in (torch.float32, torch.bfloat16)
    }

    def greedy(model: Any, ids: list[int]) -> list[int]:
        with torch.no_grad():
            out = model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=MAX_TOKENS,
                do_sample=False,
                pad_token_id=tokenizer.eos_token_id,
            )
        return [int(t) for t in out[0][len(ids) :]]

    prompts, bf16 = [], []
    for name, text in PROMPTS:
        progress(f"float32 reference: {name}")
        messages = [{"role": "user", "content": text}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if not isinstance(ids, list):  # newer transformers return a BatchEncoding
            ids = list(ids["input_ids"])  # type: ignore[index]
        ids = [int(t) for t in ids]  # type: ignore[arg-type]
        tokens = greedy(models[torch.float32], ids)
        half = greedy(models[torch.bfloat16], ids)
        prompts.append(
            {
                "name": name,
                "messages": messages,
                "prompt_token_ids": ids,
                "token_ids": tokens,
                "text": tokenizer.decode(tokens, skip_special_tokens=True),
            }
        )
        bf16.append({"token_ids": half, "agreement": agreeing_prefix(tokens, half)})
    data = {
        "version": REFERENCE_VERSION,
        "max_tokens": MAX_TOKENS,
        "dtype": "float32",
        "engine": f"transformers {transformers.__version__}",
        "prompts": prompts,
        "bf16": bf16,
    }
    path = reference_path(folder)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.rename(path)
    return data
