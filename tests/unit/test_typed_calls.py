"""Typed calls (issue 27, item 3): a type checker holds every call of an activity, every
start of a workflow (``Client.start``, ``wf.start``, ``start_child``) to the function's
parameters, and ``Client.result`` to its return type.

``tests/typing/wrong_calls.py`` marks each call that must be refused with a comment starting ``E:``; mypy
--strict and pyright (strict) must report an error on every marked line and on no other;
``tests/typing/right_calls.py`` holds the accepted forms (the options mixed with the
arguments included) and must get no error from either. Before the calls were typed, mypy
reported none of the marked lines but the two assignments of a wrong result type.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mypy import api as mypy_api

from tests.support import REPO_ROOT

TYPING = REPO_ROOT / "tests" / "typing"
RIGHT = TYPING / "right_calls.py"
WRONG = TYPING / "wrong_calls.py"
_MARK = re.compile(r"#\s*E:")


def marked_lines(path: Path) -> set[int]:
    return {n for n, line in enumerate(path.read_text().splitlines(), 1) if _MARK.search(line)}


def mypy_errors() -> dict[str, set[int]]:
    """The lines mypy --strict (the project's configuration) reports an error on, per file."""
    out, err, _status = mypy_api.run(["--config-file", str(REPO_ROOT / "pyproject.toml"), str(RIGHT), str(WRONG)])
    assert "error: " in out or not err, err
    found: dict[str, set[int]] = {RIGHT.name: set(), WRONG.name: set()}
    for match in re.finditer(r"^(?:.*/)?(\w+\.py):(\d+): error:", out, re.MULTILINE):
        found.setdefault(match[1], set()).add(int(match[2]))
    return found


def pyright_errors(tmp_path: Path) -> dict[str, set[int]]:
    """The lines pyright in strict mode reports an error on, per file."""
    pyright = shutil.which("pyright", path=str(Path(sys.executable).parent)) or shutil.which("pyright")
    if pyright is None:
        pytest.skip("pyright is not installed (pip install -c constraints.txt -e '.[dev]')")
    config = tmp_path / "pyrightconfig.json"
    config.write_text(json.dumps({"typeCheckingMode": "strict", "pythonVersion": "3.11"}))
    run = subprocess.run(
        [pyright, "--outputjson", "-p", str(config), "--pythonpath", sys.executable, str(RIGHT), str(WRONG)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO_ROOT,
    )
    report = json.loads(run.stdout)
    found: dict[str, set[int]] = {RIGHT.name: set(), WRONG.name: set()}
    for diagnostic in report["generalDiagnostics"]:
        if diagnostic["severity"] == "error":
            found.setdefault(Path(diagnostic["file"]).name, set()).add(diagnostic["range"]["start"]["line"] + 1)
    return found


def test_the_marks_are_many() -> None:
    assert len(marked_lines(WRONG)) >= 20 and marked_lines(RIGHT) == set()


def test_mypy_refuses_every_marked_call_and_accepts_the_right_ones() -> None:
    found = mypy_errors()
    assert found[RIGHT.name] == set(), "mypy refuses right calls"
    assert found[WRONG.name] == marked_lines(WRONG)


def test_pyright_refuses_every_marked_call_and_accepts_the_right_ones(tmp_path: Path) -> None:
    found = pyright_errors(tmp_path)
    assert found[RIGHT.name] == set(), "pyright refuses right calls"
    assert found[WRONG.name] == marked_lines(WRONG)
