"""docs/layout.md's table matches the tree: every package is a row, every module a row
names exists in that row's folder, and every module of a library or service package is named
(a reader who opens a folder finds nothing the page did not mention)."""

from __future__ import annotations

import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGE_ROOTS = ("shared", "services", "devtools")
# folders whose modules the table does not list one by one: the migrations are numbered
# revisions, and the developer tools' subpackages are named by their commands
UNLISTED_MODULES = {"shared/kenning/migrations", "shared/kenning/migrations/versions"}
UNLISTED_UNDER = ("devtools/kenning_devtools/",)


def layout_rows() -> dict[str, str]:
    """folder -> the row's "what" cell, for every row of docs/layout.md's table."""
    section = (REPO_ROOT / "docs" / "layout.md").read_text()
    rows: dict[str, str] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        for folder in re.findall(r"`([^`]+)`", cells[0]):
            rows[folder.rstrip("/")] = cells[2]
    return rows


def packages() -> list[str]:
    found = []
    for root in PACKAGE_ROOTS:
        for init in (REPO_ROOT / root).rglob("__init__.py"):
            found.append(init.parent.relative_to(REPO_ROOT).as_posix())
    return sorted(found)


def test_every_package_is_a_row_of_the_layout_table() -> None:
    rows = layout_rows()
    missing = [
        package
        for package in packages()
        if package not in rows
        and package not in UNLISTED_MODULES
        and not any(package.startswith(prefix) for prefix in UNLISTED_UNDER)
    ]
    assert missing == [], f"packages docs/layout.md's table does not name: {missing}"


def test_every_folder_the_table_names_exists() -> None:
    absent = [folder for folder in layout_rows() if not (REPO_ROOT / folder).exists()]
    assert absent == [], f"docs/layout.md's table names folders that do not exist: {absent}"


def test_modules_named_in_a_row_exist_in_its_folder() -> None:
    wrong = []
    for folder, what in layout_rows().items():
        for name in re.findall(r"`([\w/]+\.py)`", what):
            if not (REPO_ROOT / folder / name).exists() and not name.startswith(("tests/", "kenning/")):
                wrong.append(f"{folder}/{name}")
    assert wrong == [], f"docs/layout.md's table names modules that do not exist: {wrong}"


def test_every_module_of_a_listed_package_is_named() -> None:
    rows = layout_rows()
    unnamed = []
    for package in packages():
        if package in UNLISTED_MODULES or any(package.startswith(p) for p in UNLISTED_UNDER):
            continue
        named = set(re.findall(r"`([\w]+\.py)`", rows.get(package, "")))
        for module in sorted((REPO_ROOT / package).glob("*.py")):
            if module.name != "__init__.py" and module.name not in named:
                unnamed.append(f"{package}/{module.name}")
    assert unnamed == [], f"modules docs/layout.md's table does not name: {unnamed}"
