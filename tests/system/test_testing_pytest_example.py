"""docs/testing.md's pytest example runs as a reader runs it (issue 38, item 2): saved as a
test file in a folder of its own and run by a fresh ``pytest`` process whose configuration
sets no ``asyncio_mode`` (pytest-asyncio's default, strict), on both backends. This suite's
own configuration sets ``asyncio_mode = "auto"``, which hid an example that failed without it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support import REPO_ROOT

DOC = REPO_ROOT / "docs" / "testing.md"


def pytest_block() -> str:
    blocks = re.findall(r"^```python\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)
    tests = [block for block in blocks if "import pytest" in block and "asyncio.run(" not in block]
    assert len(tests) == 1, "docs/testing.md should hold one pytest example"
    return str(tests[0])


def test_the_pytest_example_passes_without_asyncio_mode_auto(tmp_path: Path, pg_server_url: str) -> None:
    (tmp_path / "test_orders.py").write_text(pytest_block())
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # the reader's: no asyncio_mode
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    env["KENNING_TEST_DATABASE_URL"] = pg_server_url  # the fixture's postgresql mode makes a database there
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_orders.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=170,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "2 passed" in output, output
