"""docs/architecture.md stays true to the tree (no database, no processes).

- Every comment or docstring that cites an invariant by number ("docs/architecture.md
  invariant 3", "invariants 1 and 4") cites one the document defines, and says where it
  is defined.
- Every file named in the document exists, and every ``path::name`` names a function,
  class, method, fixture, test or module-level name defined in that file.
- Each invariant names the code that enforces it and at least one test that proves it.
- The README links the document.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from pathlib import Path

from tests.support import REPO_ROOT

DOC = "docs/architecture.md"
# Where citations are looked for: the code, the tests, the scripts and the documents.
CITING_TREES = ("shared", "services", "devtools", "tests", "scripts")
CITING_DOCUMENTS = ("README.md", "docs")
# How a citation says where its number is defined: the invariants live in the repository,
# so "design invariant 3" (the brief outside it) no longer counts as saying where.
CITATION_SOURCES = ("docs/architecture.md", "architecture.md")

_CITATION = re.compile(
    r"(?:(?P<source>docs/architecture\.md|architecture\.md)\s+)?"
    r"\binvariants?\s+(?P<numbers>\d+(?:\s*(?:,|and|or|&)\s*\d+)*)",
    re.IGNORECASE,
)
_INVARIANT_HEADING = re.compile(r"^### (\d+)\. \S", re.MULTILINE)
# `path` or `path::name` in backticks, for the repository's own folders and files.
_REFERENCE = re.compile(
    r"`(?P<path>(?:shared|services|devtools|tests|docs|scripts|examples)/[\w./-]+|README\.md|compose\.yaml"
    r"|pyproject\.toml|Dockerfile)(?:::(?P<name>[\w.]+))?`"
)
# a test module, in one of the tiers' folders (tests/tiers.py)
_TEST_FILE = re.compile(r"tests/(?:unit|integration|system)/test_\w+\.py")
_LINK = re.compile(r"\]\((?P<target>[^)#\s]+)(?:#[^)]*)?\)")


def _doc_text() -> str:
    return (REPO_ROOT / DOC).read_text(encoding="utf-8")


def _section(text: str, title: str) -> str:
    """The body of the ``## title`` section."""
    match = re.search(rf"^## {re.escape(title)}\n(?P<body>.*?)(?=^## |\Z)", text, flags=re.MULTILINE | re.DOTALL)
    assert match is not None, f"{DOC} has no section '## {title}'"
    return match.group("body")


def defined_invariants() -> dict[int, str]:
    """Invariant number -> its subsection's text, from the "Invariants" section."""
    body = _section(_doc_text(), "Invariants")
    parts = _INVARIANT_HEADING.split(body)
    return {int(number): text for number, text in zip(parts[1::2], parts[2::2], strict=True)}


def _flattened(text: str) -> str:
    """The text with comment continuations joined: ``# (docs/architecture.md\\n# invariant 3)`` reads
    as one phrase, as does a docstring broken over lines."""
    return re.sub(r"\s*\n\s*(?:#\s*)?", " ", text)


def _citing_files() -> Iterator[Path]:
    for tree in CITING_TREES:
        # this file's examples of citations are not citations
        yield from sorted(p for p in (REPO_ROOT / tree).rglob("*.py") if p != Path(__file__).resolve())
    for name in CITING_DOCUMENTS:
        path = REPO_ROOT / name
        yield from sorted(path.rglob("*.md")) if path.is_dir() else [path]


def citations(text: str) -> list[tuple[str | None, list[int], str]]:
    """(source or None, numbers, the phrase) of each invariant cited by number in ``text``."""
    found = []
    for match in _CITATION.finditer(_flattened(text)):
        numbers = [int(n) for n in re.findall(r"\d+", match.group("numbers"))]
        found.append((match.group("source"), numbers, match.group(0)))
    return found


def test_the_document_defines_the_nine_invariants_in_order() -> None:
    assert list(defined_invariants()) == list(range(1, 10))


def test_every_cited_invariant_is_defined_and_the_citation_says_where() -> None:
    defined = set(defined_invariants())
    problems = []
    for path in _citing_files():
        where = path.relative_to(REPO_ROOT)
        for source, numbers, phrase in citations(path.read_text(encoding="utf-8")):
            undefined = [n for n in numbers if n not in defined]
            if undefined:
                problems.append(f"{where}: {phrase!r} cites undefined invariant(s) {undefined}")
            if source is None and str(where) != DOC:
                problems.append(f"{where}: {phrase!r} does not say where: write 'docs/architecture.md invariant N'")
    assert problems == [], "\n".join(problems)


def test_the_citation_pattern_reads_the_forms_in_use() -> None:
    text = """x  # a fenced write (docs/architecture.md
        # invariant 3), and docs/architecture.md invariants 1 and 4; invariant 12; every invariant"""
    assert citations(text) == [
        ("docs/architecture.md", [3], "docs/architecture.md invariant 3"),
        ("docs/architecture.md", [1, 4], "docs/architecture.md invariants 1 and 4"),
        (None, [12], "invariant 12"),
    ]


@functools.cache
def _defined_names(path: Path) -> frozenset[str]:
    """Every name a Python file defines: functions, classes, methods as ``Class.method``
    and bare, and module-level assignments."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    names.update({item.name, f"{node.name}.{item.name}"})
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return frozenset(names)


def references(text: str) -> list[tuple[str, str | None]]:
    return [(m.group("path"), m.group("name")) for m in _REFERENCE.finditer(text)]


def test_every_file_and_name_the_document_cites_exists() -> None:
    problems = []
    for path, name in references(_doc_text()):
        file = REPO_ROOT / path
        if not file.exists():
            problems.append(f"{path}: no such file")
        elif name is not None and name not in _defined_names(file):
            problems.append(f"{path}::{name}: {path} defines no {name}")
    assert problems == [], "\n".join(problems)


def test_every_link_of_the_document_resolves() -> None:
    missing = [
        m.group("target")
        for m in _LINK.finditer(_doc_text())
        if "://" not in m.group("target") and not (REPO_ROOT / "docs" / m.group("target")).exists()
    ]
    assert missing == []


def test_each_invariant_names_the_code_that_enforces_it_and_tests_that_prove_it() -> None:
    problems = []
    for number, text in defined_invariants().items():
        cited = references(text)
        if not any(not path.startswith("tests/") and (REPO_ROOT / path).suffix == ".py" for path, _ in cited):
            problems.append(f"invariant {number} names no code that enforces it")
        if not any(_TEST_FILE.fullmatch(path) and name is not None for path, name in cited):
            problems.append(f"invariant {number} names no test (tests/<tier>/test_X.py::test_name) that proves it")
    assert problems == [], "\n".join(problems)


def test_the_readme_links_the_architecture_document() -> None:
    assert "](docs/architecture.md)" in (REPO_ROOT / "README.md").read_text(encoding="utf-8")
