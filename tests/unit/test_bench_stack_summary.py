"""py-spy's collapsed stacks summarised: layers by leaf frame, self and inclusive counts."""

from __future__ import annotations

from pathlib import Path

from bench.gateway.stack_summary import layer_of, main, summarise

HEAD = "process 1:ray::ServeReplica;thread (0x7F01);run (asyncio/runners.py:118);"
RAW = [
    HEAD + "handle (serve_apps/http/surface.py:200);dumps (json/encoder.py:199) 30\n",
    HEAD + "handle (serve_apps/http/surface.py:210) 50\n",
    HEAD + "send (httpx/_client.py:1600) 20\n",
    "garbage line without a count\n",
]


def test_shares_by_leaf_layer_and_functions_once_per_stack() -> None:
    s = summarise(RAW)
    assert s.total == 100
    assert dict(s.layers) == {"spillover": 50, "json / pydantic": 30, "httpx / httpcore": 20}
    assert s.self_top[0] == ("handle (http/surface.py)", 50)
    inclusive = dict(s.inclusive_top)
    assert inclusive["run (asyncio/runners.py)"] == 100
    assert inclusive["handle (http/surface.py)"] == 80  # two lines of one function, counted per stack


def test_layers() -> None:
    assert layer_of("/x/site-packages/starlette/routing.py") == "starlette / uvicorn / fastapi"
    assert layer_of("/x/site-packages/ray/serve/_private/replica.py") == "ray"
    assert layer_of("/usr/lib/python3.11/weird.py") == "other"


def test_cli_renders_markdown_and_reports_a_missing_file(tmp_path: Path, capsys: object) -> None:
    path = tmp_path / "p.txt"
    path.write_text("".join(RAW))
    assert main([str(path)]) == 0
    assert main([str(tmp_path / "missing.txt")]) == 1
