"""No Python module of the project is longer than MAX_LINES lines: one concept per module, and a module a
reader can hold in their head. A module that grows past it is split by concept (a test file into a second
file named by what it tests, its shared helpers into a small helper module), not given an exception."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("router", "cluster", "serve_apps", "bench", "spillover", "tests")
MAX_LINES = 400


def line_count(path: Path) -> int:
    """Lines as `wc -l` counts them for a file that ends with a newline."""
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_module_is_over_the_limit() -> None:
    modules = [path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))]
    assert len(modules) > 100  # the scan found the project
    over = [f"{path.relative_to(ROOT)}: {n} lines" for path in modules if (n := line_count(path)) > MAX_LINES]
    assert over == [], f"split by concept, at most {MAX_LINES} lines each"


def test_the_count_is_wc_l(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("a = 1\n\nb = 2\n")
    assert line_count(sample) == 3
