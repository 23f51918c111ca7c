"""Features import each other only through declared doors.

A wing is a sub-package of a split package (router/request/, router/routing/, ...). Its `__init__.py`
declares `DOORS`: the modules of the wing the rest of the same package may import (its value types,
protocols, pure rules and what the composition root builds; `__init__` for the package itself). Any other
module of the wing is the wing's own: another wing or a top-level module importing it —
at module level or inside a function — is a failure naming the file and line. The package's top-level
modules (router/errors.py, serve_apps/gateway_build.py, ...) are the shared core and the composition; a wing
may import them freely.

Read from the source with `ast`, as tests/unit/test_layers.py is: nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WINGED = ("router", "cluster", "serve_apps")  # the packages whose wings declare their doors


def declared_doors(wing: Path) -> tuple[str, ...]:
    tree = ast.parse((wing / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "DOORS":
            assert node.value is not None, wing
            doors = ast.literal_eval(node.value)
            assert isinstance(doors, tuple) and all(isinstance(d, str) for d in doors), wing
            return doors
    raise AssertionError(f"{wing.relative_to(wing.parents[1])}/__init__.py declares no DOORS")


def wings(package: Path) -> dict[str, tuple[str, ...]]:
    return {p.parent.name: declared_doors(p.parent) for p in sorted(package.glob("*/__init__.py"))}


def imported_modules(path: Path, package: Path) -> list[tuple[int, list[str]]]:
    """Every module of `package` a file imports, as its dotted path split (`from a.b import c` counts
    `a.b.c` when c is a module, else `a.b`)."""
    found: list[tuple[int, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                names.append(candidate if _is_module(package.parent, candidate) else node.module)
        found += [(node.lineno, name.split(".")) for name in names if name.split(".")[0] == package.name]
    return found


def _is_module(root: Path, dotted: str) -> bool:
    where = root.joinpath(*dotted.split("."))
    return where.with_suffix(".py").exists() or (where / "__init__.py").exists()


def doors_broken(package: Path) -> list[str]:
    doors = wings(package)
    problems = []
    for path in sorted(package.rglob("*.py")):
        inside = path.relative_to(package).parts
        own = inside[0] if len(inside) > 1 else None
        for line, parts in sorted(imported_modules(path, package)):
            if len(parts) < 2 or parts[1] not in doors or parts[1] == own:
                continue  # the core, or the importer's own wing
            module = parts[2] if len(parts) > 2 else "__init__"  # the wing's package itself
            if module not in doors[parts[1]]:
                what = ".".join([*parts[:2], module])
                problems.append(
                    f"{path.relative_to(package.parent)}:{line} imports {what}, not a door of {parts[1]}/ "
                    f"(its doors: {', '.join(doors[parts[1]]) or 'none'})"
                )
    return problems


def test_wings_import_each_other_only_through_their_doors() -> None:
    for name in WINGED:
        assert len(wings(REPO / name)) >= 4, name  # the scan found the wings
        problems = doors_broken(REPO / name)
        assert not problems, "imports past a wing's doors:\n" + "\n".join(problems)


def test_every_declared_door_is_a_module_of_its_wing() -> None:
    for name in WINGED:
        for wing, doors in wings(REPO / name).items():
            missing = [d for d in doors if not (REPO / name / wing / f"{d}.py").exists()]  # __init__ included
            assert not missing, f"{name}/{wing}/ declares doors that are not its modules: {missing}"


def _tree(tmp_path: Path) -> Path:
    package = tmp_path / "pkg"
    for wing, doors in (("a", '("door",)'), ("b", "()")):
        (package / wing).mkdir(parents=True)
        (package / wing / "__init__.py").write_text(f'"""wing {wing}."""\n\nDOORS: tuple[str, ...] = {doors}\n')
    (package / "__init__.py").write_text("")
    (package / "core.py").write_text("")
    (package / "a" / "door.py").write_text("from pkg import core\n")
    (package / "a" / "inner.py").write_text("from pkg.a import door\n")
    return package


def test_the_check_passes_doors_the_core_and_a_wing_s_own_modules(tmp_path: Path) -> None:
    package = _tree(tmp_path)
    (package / "b" / "user.py").write_text("from pkg.a.door import x\nfrom pkg import core\nimport pkg.b.user\n")
    assert doors_broken(package) == []


def test_the_check_sees_a_wing_s_own_module_imported_from_another_wing(tmp_path: Path) -> None:
    package = _tree(tmp_path)
    (package / "b" / "user.py").write_text("def f():\n    from pkg.a import inner\n\n\nimport pkg.a.inner\n")
    assert doors_broken(package) == [
        "pkg/b/user.py:2 imports pkg.a.inner, not a door of a/ (its doors: door)",
        "pkg/b/user.py:5 imports pkg.a.inner, not a door of a/ (its doors: door)",
    ]
    (package / "b" / "user.py").write_text("from pkg import a\n")
    assert doors_broken(package) == ["pkg/b/user.py:1 imports pkg.a.__init__, not a door of a/ (its doors: door)"]
