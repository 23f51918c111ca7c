"""Docs that live in the repository, and code that cites only the repository.

* docs/configuration.md is what `cluster.config_docs.render()` makes of the config's pydantic models,
  and every config key has a description;
* the code, configs, scripts and docs cite no document that is not in the repository (a design
  document, planning notes, issue numbers): a reader must be able to follow every pointer.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, Field

from cluster import config_docs

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("router", "cluster", "serve_apps", "bench", "cli", "tests")

# Pointers to text outside the repository: the design notes, their sections, planning issues and the
# source articles ("seed 002"). A random seed (`--seed 0`, "seed of the fault draws") is no citation.
CITATION = re.compile(r"DESIGN\.md|\u00a7|\bissues? #?\d+\b|\bseeds? \d{3}\b|\bthe seeds\b", re.IGNORECASE)


def _cited_files() -> list[Path]:
    files = [p for package in PACKAGES for p in sorted((REPO / package).rglob("*.py"))]
    files += sorted((REPO / "configs").glob("*.yaml")) + sorted((REPO / "scripts").glob("*"))
    files += [REPO / "README.md", REPO / "pyproject.toml", *sorted((REPO / "docs").glob("*.md"))]
    return [p for p in files if p.is_file() and p.resolve() != Path(__file__).resolve()]


def citations_outside_the_repo(files: list[Path]) -> list[str]:
    found = []
    for path in files:
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if match := CITATION.search(line):
                found.append(f"{path.relative_to(REPO)}:{number}: {match.group(0)!r} in {line.strip()[:100]!r}")
    return found


def test_code_and_docs_cite_only_repository_files() -> None:
    found = citations_outside_the_repo(_cited_files())
    assert not found, (
        "cite a file of the repository (docs/architecture.md, the module that holds the fact) instead of:\n"
        + "\n".join(found)
    )


def test_the_citation_check_sees_each_form() -> None:
    lines = ["x = 1  # see DESIGN.md", "(issue 6)", "seed 002's practice", "Defaults follow the seeds", "§3"]
    innocent = ["rng = random.Random(seed)", "--seed 0", "the seed of the fault draws", "issues show"]
    assert [bool(CITATION.search(line)) for line in lines] == [True] * len(lines)
    assert not any(CITATION.search(line) for line in innocent)


def test_configuration_doc_is_generated_from_the_models() -> None:
    committed = (REPO / "docs/configuration.md").read_text()
    assert committed == config_docs.render(), (
        f"docs/configuration.md is out of date: run `.venv/bin/{config_docs.COMMAND}`"
    )


def test_a_config_key_without_a_description_is_refused() -> None:
    class Section(BaseModel):
        documented: int = Field(1, description="has one")
        bare: int = 2

    class Root(BaseModel):
        section: Section = Field(Section(), description="a section")

    missing: list[str] = []
    tables = config_docs._tables(Root, "", "", {}, missing)
    assert missing == ["section.bare"]
    assert [t.path for t in tables] == ["", "section"]
