"""What every page handler of the console shares: ``console_of(request)``.

One ``Console`` per process, built by ``kenning_console.app.create_app`` and kept on the
Starlette app's state, so route modules (instances, actions, events) need no globals.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from starlette.requests import Request
from starlette.templating import Jinja2Templates

from kenning.app import App
from kenning.core.cancelling import wait_until_set
from kenning.db import Database, Executor
from kenning_console.settings import ConsoleSettings
from kenning_console.standing import Standings

if TYPE_CHECKING:
    from kenning.client.streams import StreamReaders
    from kenning_console.live import Watchers

T = TypeVar("T")


@dataclass
class Console:
    settings: ConsoleSettings
    templates: Jinja2Templates
    app: App | None  # the user's workflows (--app), if given: the start form needs their signatures
    database: Database | None = field(default=None)
    # woken by NOTIFY (kenning_console.live); server-sent event streams wait on it
    changes: Changes = field(default_factory=lambda: Changes())
    watchers: Watchers | None = field(default=None)  # the LISTEN connection while a page watches
    downloads: int = 0  # values streaming now (kenning_console.values)
    # why the console is not ready (its commits do not complete), while it serves
    readiness: Callable[[], str | None] | None = field(default=None)
    readers: StreamReaders | None = field(default=None)  # durable streams' readers (kenning_console.streams)
    streams_open: int = 0  # durable streams served now
    # each watched instance's standing, read once per move for every page (kenning_console.standing)
    standings: Standings = field(default_factory=lambda: Standings())

    async def read(self, statement: Callable[[Executor], Awaitable[T]]) -> T:
        """Run one statement on a pooled autocommit connection, bounded by the database timeout."""
        assert self.database is not None, "the console is not started"
        async with asyncio.timeout(self.settings.database_timeout * 2):
            async with self.database.connection() as conn:
                return await statement(conn)

    async def write(self, statements: Callable[[Executor], Awaitable[T]]) -> T:
        """Run ``statements`` in one transaction, bounded by the database timeout (a lock
        waited on too long rolls it back: the page answers 503, nothing half done)."""
        assert self.database is not None, "the console is not started"
        async with asyncio.timeout(self.settings.database_timeout * 2):
            async with self.database.transaction() as conn:
                return await statements(conn)


class Changes:
    """A generation counter bumped on every NOTIFY the console hears; each waiter sleeps
    until it moves (or a timeout), then reads what it shows again."""

    def __init__(self) -> None:
        self.generation = 0
        self._moved = asyncio.Event()

    def bump(self) -> None:
        self.generation += 1
        moved, self._moved = self._moved, asyncio.Event()
        moved.set()

    async def wait(self, seen: int, timeout: float) -> int:
        """The generation once it differs from ``seen``, or after ``timeout`` seconds."""
        if self.generation == seen:
            await wait_until_set(self._moved, timeout)
        return self.generation


def console_of(request: Request) -> Console:
    console: Console = request.app.state.console
    return console
