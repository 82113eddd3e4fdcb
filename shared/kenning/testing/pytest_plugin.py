"""The pytest plugin (entry point ``pytest11``: ``kenning``): the ``workflow_env`` fixture.

    async def test_paid(workflow_env: WorkflowEnvironment) -> None:   # in memory
        handle = await workflow_env.start(order_saga, order=...)

    @pytest.mark.parametrize("workflow_env", ["memory", "postgresql"], indirect=True)
    async def test_paid_both_ways(workflow_env: WorkflowEnvironment) -> None: ...

``postgresql`` runs on a database of the test's own, made on the server named by
``KENNING_TEST_DATABASE_URL`` (dropped afterwards), or on an embedded PostgreSQL (the
``kenning[embedded]`` wheel) when it is unset. Override the ``workflow_app`` fixture to
run an App of your own (its hooks, its default retry policy). Async tests need an async
plugin (pytest-asyncio, anyio); the fixture is an async generator.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import pytest

if TYPE_CHECKING:
    from kenning.app import App
    from kenning.db import Executor
    from kenning.testing.environment import WorkflowEnvironment

MODES = ("memory", "postgresql")
SERVER_VARIABLE = "KENNING_TEST_DATABASE_URL"
F = TypeVar("F", bound=Callable[..., Any])


@pytest.fixture
def workflow_app() -> App | None:
    """The App the environment runs (None: one over every registered workflow)."""
    return None


def _async_fixture(func: F) -> F:
    """pytest-asyncio's fixture decorator when it is installed (its strict mode needs it),
    else pytest's (anyio's plugin takes plain async fixtures)."""
    try:
        import pytest_asyncio
    except ImportError:  # pragma: no cover - the dev extra has it
        return cast(F, pytest.fixture(func))
    return cast(F, pytest_asyncio.fixture(func))


@_async_fixture
async def workflow_env(request: pytest.FixtureRequest, workflow_app: App | None) -> AsyncIterator[WorkflowEnvironment]:
    """A ``WorkflowEnvironment``: in memory, or ``postgresql`` when parametrized so."""
    from kenning.testing.environment import WorkflowEnvironment

    mode = getattr(request, "param", "memory")
    if mode not in MODES:
        raise pytest.UsageError(f"workflow_env: the mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "memory":
        async with WorkflowEnvironment(workflow_app) as env:
            yield env
        return
    server = os.environ.get(SERVER_VARIABLE)
    if not server:
        async with WorkflowEnvironment(workflow_app, embedded=True) as env:
            yield env
        return
    async with _database_of_its_own(server) as url, WorkflowEnvironment(workflow_app, database_url=url) as env:
        yield env


class _database_of_its_own:  # noqa: N801 - used as a context manager, named like one
    """A new database on ``server`` for one test, dropped after it."""

    def __init__(self, server: str) -> None:
        from kenning.hosting.embedded import with_database

        self.name = f"kenning_env_{uuid.uuid4().hex[:12]}"
        self.admin = with_database(server, "postgres")
        self.url = with_database(server, self.name)

    async def __aenter__(self) -> str:
        from kenning.storage.testing import testing_create_database

        await self._admin(testing_create_database)
        return self.url

    async def __aexit__(self, *exc: object) -> None:
        from kenning.storage.testing import testing_drop_database

        await self._admin(testing_drop_database)

    async def _admin(self, statement: Callable[[Executor, str], Awaitable[None]]) -> None:
        import psycopg

        from kenning.db import Executor

        async with await psycopg.AsyncConnection.connect(self.admin, autocommit=True) as conn:
            await statement(Executor(conn), self.name)
