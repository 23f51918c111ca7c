"""Layers go one way: router ← cluster ← serve_apps ← bench ← spillover.

A module may import from its own layer and the layers below it, never above — at module level or
inside a function (a function-level import is still a dependency). Read from the source with `ast`,
so the check needs nothing installed and names the file and line of every wrong-way import.

    router      pure domain: contracts, routing, saturation, retry/health state machines
    cluster     what the cluster has: config, NVML, model catalog, capacity formulas
    serve_apps  Ray Serve, HTTP, providers and other I/O adapters
    bench       load generation, calibration, the cloud simulator
    spillover   the `spillover` command
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAYERS = ["router", "cluster", "serve_apps", "bench", "spillover"]


def imported_packages(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def wrong_way_imports() -> list[str]:
    problems = []
    for rank, layer in enumerate(LAYERS):
        for path in sorted((REPO / layer).rglob("*.py")):
            for line, package in imported_packages(path):
                if package in LAYERS and LAYERS.index(package) > rank:
                    problems.append(f"{path.relative_to(REPO)}:{line} ({layer}) imports {package}")
    return problems


def test_no_layer_imports_a_layer_above_it() -> None:
    problems = wrong_way_imports()
    assert not problems, "wrong-way imports:\n" + "\n".join(problems)


def test_the_check_sees_function_level_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import os\n\ndef f():\n    from serve_apps.gateway import Gateway\n    return Gateway\n")
    assert (4, "serve_apps") in imported_packages(module)
