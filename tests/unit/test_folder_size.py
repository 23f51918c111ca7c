"""No folder of the project holds more than MAX_MODULES Python modules (`*.py` files, `__init__.py` included):
a folder is a feature a reader can see whole, and one that grows past it is split into sub-packages by
feature, as router/ is (router/request/, router/routing/, router/resilience/, ...).

Enforced for every package of the project — router/, cluster/, serve_apps/, bench/ and spillover/ — and every
folder under them (bench/ is split by command: bench/calibrate/, bench/soak/, bench/gateway/, ...; cluster/ and
serve_apps/ by feature: cluster/config/, cluster/capacity/, serve_apps/http/, serve_apps/dispatch/, ...).
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPLIT = ("router", "cluster", "serve_apps", "bench", "spillover")  # the packages whose every folder keeps the limit
MAX_MODULES = 15


def over_full_folders(package: Path) -> list[str]:
    folders = [package, *sorted(p for p in package.rglob("*") if p.is_dir() and p.name != "__pycache__")]
    counts = {folder: len(list(folder.glob("*.py"))) for folder in folders}
    return [f"{folder.relative_to(package.parent)}/: {n} modules" for folder, n in counts.items() if n > MAX_MODULES]


def test_no_folder_of_a_split_package_is_over_the_limit() -> None:
    assert len(list((ROOT / "router").rglob("*.py"))) > 50  # the scan found the project
    over = [line for package in SPLIT for line in over_full_folders(ROOT / package)]
    assert over == [], f"split by feature into sub-packages, at most {MAX_MODULES} modules a folder"


def test_the_check_sees_an_over_full_sub_folder(tmp_path: Path) -> None:
    wing = tmp_path / "pkg" / "wing"
    wing.mkdir(parents=True)
    for n in range(MAX_MODULES + 1):
        (wing / f"m{n}.py").write_text("")
    (tmp_path / "pkg" / "__init__.py").write_text("")
    assert over_full_folders(tmp_path / "pkg") == [f"pkg/wing/: {MAX_MODULES + 1} modules"]
    (wing / "m0.py").unlink()
    assert over_full_folders(tmp_path / "pkg") == []
