"""No constructor in router/, cluster/, serve_apps/, bench/ or spillover/ takes more than 8 parameters.

A constructor past that wires too much in one place: group its collaborators into small frozen
bundles (serve_apps/dispatch/parts.py, serve_apps/gateway_parts.py) and let the gateway's composition
(serve_apps/gateway_build.py) build each part once. Read from the source with `ast`, so the check needs
nothing installed and names the file, line and class of every constructor past the limit.

Counted: every parameter but the first of an `__init__` (`self`), positional-only and keyword-only
ones included; `*args` and `**kwargs` count as one each. No allow-list.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ["router", "cluster", "serve_apps", "bench", "spillover"]
MAX_PARAMETERS = 8


def parameter_count(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    args = function.args
    named = [*args.posonlyargs, *args.args]
    count = len(named) + len(args.kwonlyargs) + (args.vararg is not None) + (args.kwarg is not None)
    return count - 1 if named else count  # the first one is `self`


def oversized(path: Path) -> list[tuple[int, str, int]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name == "__init__":
                if (count := parameter_count(item)) > MAX_PARAMETERS:
                    found.append((item.lineno, node.name, count))
    return found


def test_no_constructor_takes_more_than_eight_parameters() -> None:
    problems = [
        f"{path.relative_to(REPO)}:{line} {name}.__init__ takes {count}"
        for package in PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
        for line, name, count in oversized(path)
    ]
    assert not problems, f"constructors over {MAX_PARAMETERS} parameters:\n" + "\n".join(problems)


def test_the_count_excludes_self_and_counts_star_args_once(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "class Small:\n    def __init__(self, a, b, /, c, *args, d, e, **kwargs):\n        pass\n\n"
        "class Big:\n    def __init__(self, a, b, c, d, e, f, g, h, *, i):\n        pass\n"
    )
    assert oversized(module) == [(6, "Big", 9)]
