"""docs/architecture.md's "Engine shape" table and ``kenning.engine``'s docstring match the
engine's folder, as tests/unit/test_layout.py holds docs/layout.md to the tree: every module
of ``shared/kenning/engine/`` has its row and its line, no row names a module that is gone,
and a name a row introduces (```Name`: ...``, ```Name`, ...``) is defined in that row's
module."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
ENGINE = REPO_ROOT / "shared" / "kenning" / "engine"
ENGINE_PREFIX = "shared/kenning/engine/"


def engine_modules() -> set[str]:
    return {path.stem for path in ENGINE.glob("*.py") if path.name != "__init__.py"}


def table_rows() -> dict[str, str]:
    """module path -> the row's "what it does" cell, for the "Engine shape" section's table."""
    text = (REPO_ROOT / "docs" / "architecture.md").read_text()
    section = text.split("\n## Engine shape\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 2 and re.fullmatch(r"`[\w/]+\.py`", cells[0]):
            rows[cells[0].strip("`")] = cells[1]
    return rows


def defined_names(module: Path) -> set[str]:
    """Classes, functions and assigned names at the top level of ``module``."""
    names: set[str] = set()
    for node in ast.parse(module.read_text()).body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(target.id for target in node.targets if isinstance(target, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def test_the_table_has_a_row_for_every_engine_module_and_no_other() -> None:
    in_table = {Path(path).stem for path in table_rows() if path.startswith(ENGINE_PREFIX)}
    assert sorted(engine_modules() - in_table) == [], "engine modules the Engine shape table omits"
    assert sorted(in_table - engine_modules()) == [], "rows for engine modules that do not exist"


def test_every_module_the_table_names_exists() -> None:
    absent = [path for path in table_rows() if not (REPO_ROOT / path).exists()]
    assert absent == [], f"the Engine shape table names modules that do not exist: {absent}"


def test_a_name_a_row_introduces_is_defined_in_that_rows_module() -> None:
    misplaced = []
    for path, what in table_rows().items():
        defined = defined_names(REPO_ROOT / path)
        for name in re.findall(r"`(\w+)`(?=[:,])", what):
            if name not in defined:
                misplaced.append(f"{name} (row {path})")
    assert misplaced == [], f"names the Engine shape table places in a module that does not define them: {misplaced}"


def test_the_package_docstring_names_every_engine_module_and_no_other() -> None:
    docstring = ast.get_docstring(ast.parse((ENGINE / "__init__.py").read_text())) or ""
    named: set[str] = set()
    for line in docstring.splitlines():
        if line.startswith("- "):
            named.update(re.findall(r"``(\w+)``", line.split(":", 1)[0]))
    assert sorted(engine_modules() - named) == [], "engine modules kenning.engine's docstring omits"
    assert sorted(named - engine_modules()) == [], "modules kenning.engine's docstring names that do not exist"
