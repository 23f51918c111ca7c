"""Local tool calling's config keys (cluster/tool_parsers.py): the parser names are vLLM's own, and a
model's engine args either take tool calls (both keys, a known parser) or are refused when the config loads —
never a config that passes and then fails every replica's start."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from cluster.config.deployment import load_config
from cluster.config.model_spec import ModelSpec
from cluster.tool_parsers import VLLM_TOOL_PARSERS
from router.routing.capabilities import local_capabilities


def test_the_names_are_the_installed_vllms_registry() -> None:
    spec = importlib.util.find_spec("vllm")  # found, not imported (vLLM's import takes seconds)
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed here")
    source = Path(spec.origin).parent / "tool_parsers" / "__init__.py"
    tree = ast.parse(source.read_text())
    (registry,) = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign | ast.AnnAssign)
        and "_TOOL_PARSERS_TO_REGISTER" in ast.unparse(node.targets[0] if isinstance(node, ast.Assign) else node.target)
    ]
    assert isinstance(registry, ast.Dict)
    assert {ast.literal_eval(key) for key in registry.keys if key is not None} == VLLM_TOOL_PARSERS


def spec(**engine_args: Any) -> ModelSpec:
    return ModelSpec(alias="m", source="/models/m", family="qwen", accelerator="cpu", engine_args=engine_args)


def test_both_keys_and_a_known_parser_make_a_tool_capable_model() -> None:
    model = spec(enable_auto_tool_choice=True, tool_call_parser="hermes", max_model_len=4096)
    assert local_capabilities("m", model.engine_args).tools
    assert not local_capabilities("m", spec(max_model_len=4096).engine_args).tools  # neither: no tools
    assert not local_capabilities("m", spec(enable_auto_tool_choice=False).engine_args).tools


@pytest.mark.parametrize(
    ("engine_args", "fragment"),
    [
        ({"enable_auto_tool_choice": True}, "needs a tool_call_parser"),
        ({"tool_call_parser": "hermes"}, "needs enable_auto_tool_choice: true"),
        ({"enable_auto_tool_choice": False, "tool_call_parser": "hermes"}, "needs enable_auto_tool_choice: true"),
        ({"enable_auto_tool_choice": "yes", "tool_call_parser": "hermes"}, "must be true"),
        ({"enable_auto_tool_choice": True, "tool_call_parser": "hermess"}, "'hermess' is not one of vLLM's"),
        ({"enable_auto_tool_choice": True, "tool_call_parser": ["hermes"]}, "(not a parser name)"),
        ({"enable_auto_tool_choice": True, "tool_call_parser": "x" * 100_000}, "(not a parser name)"),
        ({"enable_auto_tool_choice": True, "tool_parser_plugin": "/tmp/p.py"}, "tool_parser_plugin is not supported"),
    ],
)
def test_a_config_that_would_not_start_is_refused_when_it_loads(engine_args: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValidationError) as caught:
        spec(**engine_args)
    (error,) = caught.value.errors()
    assert fragment in error["msg"] and len(error["msg"]) < 300


def test_the_gpu_config_takes_tool_calls_locally() -> None:
    config = load_config(Path(__file__).parents[2] / "configs" / "gpu.yaml")
    parsers = {m.alias: m.engine_args.get("tool_call_parser") for m in config.models}
    assert parsers == {"qwen2.5-7b-instruct": "hermes", "llama-3.1-8b-instruct": "llama3_json"}
