"""The suite's three tiers, one folder each, by what a test needs:

- ``tests/unit``: nothing outside the interpreter: no database, no process, no broker, no
  browser, no server. The engine on its in-memory port, parsing, settings, the console's
  rendering, the checks of the tree. ``pytest tests/unit`` is the inner loop (docs/development.md).
- ``tests/integration``: a PostgreSQL database (the database fixtures of ``tests/conftest.py``),
  in this process.
- ``tests/system``: real processes (``kenning`` commands, servers, ``kenning up``), brokers, a
  browser; most of them a database as well.

Each test carries its folder's mark (:func:`mark`), so ``pytest -m unit`` selects the same
tests as ``pytest tests/unit``. The helpers the tiers share stay at ``tests/``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TIERS = ("unit", "integration", "system")
TESTS = Path(__file__).resolve().parent


def tier_of(path: Path) -> str | None:
    """The tier of a test file: the folder under ``tests/`` it sits in (None outside them)."""
    try:
        folder = path.resolve().relative_to(TESTS).parts[0]
    except (ValueError, IndexError):
        return None
    return folder if folder in TIERS else None


def mark(items: list[pytest.Item]) -> None:
    """Give each test its tier's mark."""
    for item in items:
        tier = tier_of(item.path)
        if tier is not None:
            item.add_marker(tier)


def unit_only(config: pytest.Config) -> bool:
    """This run selects unit tests alone (``pytest tests/unit``, files in it, or ``-m unit``)."""
    if config.getoption("markexpr", "") == "unit":
        return True
    named = [arg.split("::", 1)[0] for arg in config.args]
    return (
        config.args_source == pytest.Config.ArgsSource.ARGS
        and bool(named)
        and all(tier_of(Path(config.invocation_params.dir, arg)) == "unit" for arg in named)
    )
