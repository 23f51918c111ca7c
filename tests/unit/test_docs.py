"""Docs that live in the repository, and code that cites only the repository.

* docs/configuration.md is what `cluster.config.docs.render()` makes of the config's pydantic models,
  and every config key has a description;
* the code, configs, scripts and docs cite no document that is not in the repository (a design
  document, planning notes, issue numbers): a reader must be able to follow every pointer.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, Field

import cluster.config.docs as config_docs

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("router", "cluster", "serve_apps", "bench", "spillover", "tests")

# Pointers to text outside the repository: design notes, their numbered sections, planning issues and
# source articles. A random seed (`--seed 0`, "seed of the fault draws") is no citation.
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
    # built from parts, so this file does not itself hold what it forbids
    design, seed, section = "DESIGN" + ".md", "seed" + " 002", "\u00a7" + "3"
    follow = "Defaults follow the " + "seeds"
    lines = [f"x = 1  # see {design}", "(" + "issue 6)", f"{seed}'s practice", follow, section]
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


# --- links and paths in README.md and docs/*.md ------------------------------------------------

FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)\)")  # the text may hold `models[]`
CODE = re.compile(r"`([^`\n]+)`")
TOP_LEVEL = ("router", "cluster", "serve_apps", "bench", "spillover", "configs", "scripts", "tests", "docs", ".ci")


def _markdown_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _prose(path: Path) -> str:
    """The text outside fenced code blocks (commands there may name files a run creates)."""
    return FENCE.sub("", path.read_text())


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces to hyphens (an
    underscore inside a word, as in a config key, is text and stays)."""
    text = re.sub(r"[`*]|(?<!\w)_|_(?!\w)|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    headings = re.findall(r"^#{1,6} (.+)$", _prose(path), re.MULTILINE)
    return {anchor(h) for h in headings}


def broken_links(path: Path) -> list[str]:
    broken = []
    for target in LINK.findall(_prose(path)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file_part, _, fragment = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{path.relative_to(REPO)}: link to a missing file: {target}")
        elif fragment and linked.suffix == ".md" and fragment not in _anchors(linked):
            broken.append(f"{path.relative_to(REPO)}: link to a missing heading: {target}")
    return broken


def repo_paths(text: str) -> list[str]:
    """Code spans that name a path in the repository: a top-level folder, then more (`router/x.py`),
    or a top-level file; placeholders (`<alias>`), globs and variables are not paths."""
    found = []
    for span in CODE.findall(text):
        path = span.split("::")[0].rstrip("/")
        if re.search(r"[\s<>*$~{}]", path) or path.startswith(("/", "./", "../")):
            continue
        first, _, rest = path.partition("/")
        if (first in TOP_LEVEL and rest) or (not rest and (REPO / first).is_file()):
            found.append(path)
    return found


def missing_paths(path: Path) -> list[str]:
    return [
        f"{path.relative_to(REPO)}: `{p}` does not exist" for p in repo_paths(_prose(path)) if not (REPO / p).exists()
    ]


def test_links_in_readme_and_docs_resolve() -> None:
    broken = [problem for path in _markdown_files() for problem in broken_links(path)]
    assert not broken, "\n".join(broken)


def test_paths_in_readme_and_docs_exist() -> None:
    missing = [problem for path in _markdown_files() for problem in missing_paths(path)]
    assert not missing, "\n".join(missing)


def test_the_path_check_tells_paths_from_other_code() -> None:
    text = "`router/errors.py` `configs/gpu.yaml` `tests/unit/x.py::test_y` `README.md` `local:<alias>` `gpu.yaml`"
    text += " `cloud:openai/*` `$SPILLOVER_CACHE/models` `/tmp/spillover-gpus.json` `x-spillover-route` `bench/`"
    assert repo_paths(text) == ["router/errors.py", "configs/gpu.yaml", "tests/unit/x.py", "README.md"]
    assert LINK.findall("see [`models[]`](#models) and [the plan](cluster/capacity/plan.py)") == [
        "#models",
        "cluster/capacity/plan.py",
    ]
    assert anchor("`resilience.retry`") == "resilienceretry"
    assert anchor("Resilience → Several gateway replicas") == "resilience--several-gateway-replicas"
