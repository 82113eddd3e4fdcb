"""The unit tier takes nothing outside the interpreter (``tests/tiers.py``): a test here that
asks for a database or for processes fails at once, saying where it belongs, rather than
reaching for a server that ``pytest tests/unit`` does not have."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def pg_server_url() -> str:
    pytest.fail("a unit test takes no database: move it to tests/integration (tests/tiers.py)", pytrace=False)


@pytest.fixture
def processes() -> None:
    pytest.fail("a unit test starts no process: move it to tests/system (tests/tiers.py)", pytrace=False)
