"""docs/testing.md's Python examples run as a reader runs them: each complete block as a
script (the pytest one is only collected), the retries example on PostgreSQL too."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

from tests.logguard import expect_log
from tests.support import REPO_ROOT

DOC = REPO_ROOT / "docs" / "testing.md"


def python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_each_example_runs(index: int, tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    expect_log("instance.failed")  # the saga's declined and timed-out orders
    block = python_blocks()[index]
    script = tmp_path / f"example_{index}.py"
    script.write_text(block)
    monkeypatch.setenv("KENNING_TEST_DATABASE_URL_FOR_DOCS", database_url)
    if "asyncio.run(" not in block:  # a test file the reader saves: it must at least import
        compile(block, str(script), "exec")
        return
    runpy.run_path(str(script), run_name="__main__")
