"""Live updates: server-sent events fed by NOTIFY.

While at least one browser watches (an open ``/live/{id}`` stream), the console
holds one LISTEN connection on the channels that say an instance moved: became runnable
(``kenning_instances``: started, woken by an event or a timer, retried), registered a wait
or timer (``kenning_timers``, ``kenning_subscriptions``), sent an event
(``kenning_outbox``), received one (``kenning_inbox``), finished (``kenning_results``,
after ``results_listen`` joined the result listeners: finishing statements notify only
while someone does, so the console costs them nothing while nobody watches). Each NOTIFY
bumps ``Console.changes``; each stream then reads its instance's fingerprint (status,
update time, history length) and sends an event if it changed. A step finishing inside a
run notifies nobody, so streams also read every ``POLL_SECONDS``. The connection is
closed ``LINGER_SECONDS`` after the last stream ends.

The page names the fingerprint it was rendered from (``?seen=``, a ``version``): the
stream compares its first read with that, not with itself, so a change between rendering
and connecting (the console's own Cancel: the page rendered "compensating", the instance
finished before the browser opened the stream) is sent at once instead of never.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any
from urllib.parse import quote

import psycopg
import structlog
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from kenning.core.database_urls import libpq_url
from kenning.core.names import CHANNEL_INBOX, CHANNEL_INSTANCES, CHANNEL_OUTBOX, CHANNEL_SUBSCRIPTIONS, CHANNEL_TIMERS
from kenning.db import Executor
from kenning.db.errors import is_unavailable
from kenning.storage import console as console_sql
from kenning.storage import results as results_sql
from kenning_console.state import Console, console_of

_log = structlog.get_logger("kenning.console")

CHANNELS = (CHANNEL_INSTANCES, CHANNEL_TIMERS, CHANNEL_SUBSCRIPTIONS, CHANNEL_OUTBOX, CHANNEL_INBOX)
POLL_SECONDS = 2.0  # steps finishing inside a run notify nobody
KEEPALIVE_SECONDS = 15.0  # a comment line, so proxies keep an idle stream open
LINGER_SECONDS = 10.0
RETRY_MILLISECONDS = 2000  # EventSource reconnects after this long
VERSION = re.compile(r"[0-9a-f]{16}")


def version(status: str, updated_at: datetime | None, lease_owner: str | None, steps: int) -> str:
    """A short digest of an instance's fingerprint: what a page says it shows."""
    stamp = updated_at.isoformat() if updated_at is not None else None
    text = json.dumps([status, stamp, lease_owner, int(steps)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _version_of(state: dict[str, Any]) -> str:
    return version(state["status"], state["updated_at"], state["lease_owner"], state["steps"])


def stream_url(instance_id: str, seen: str) -> str:
    """The live stream of an instance, for a page rendered at version ``seen``."""
    return f"/live/{quote(instance_id, safe='/')}?seen={seen}"


class Watchers:
    """Counts open streams; holds the LISTEN connection while there is one."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.count = 0
        self._task: asyncio.Task[None] | None = None
        self._linger: asyncio.TimerHandle | None = None

    def join(self) -> None:
        self.count += 1
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._listen(), name="kenning-console-listener")

    def leave(self) -> None:
        self.count -= 1
        if self.count == 0:
            self._linger = asyncio.get_running_loop().call_later(LINGER_SECONDS, self._stop_if_idle)

    def _stop_if_idle(self) -> None:
        self._linger = None
        if self.count == 0 and self._task is not None:
            self._task.cancel()

    async def stop(self) -> None:
        if self._linger is not None:
            self._linger.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _listen(self) -> None:
        database = self.console.database
        url = libpq_url(database.listen_url if database is not None else self.console.settings.database_url)
        delay = 0.1
        while True:
            try:
                keepalives = database.client_parameters if database is not None else {}
                async with await psycopg.AsyncConnection.connect(url, autocommit=True, **keepalives) as conn:
                    await results_sql.results_listen(Executor(conn))
                    for channel in CHANNELS:
                        await conn.execute(f'LISTEN "{channel}"')
                    delay = 0.1
                    self.console.changes.bump()  # anything missed while not listening
                    async for _ in conn.notifies():
                        self.console.changes.bump()
            except asyncio.CancelledError:
                raise
            except Exception as error:
                _log.warning("console.listener_disconnected", error=repr(error), retry_in=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)


@contextlib.asynccontextmanager
async def listening(console: Console) -> AsyncIterator[None]:
    console.watchers = Watchers(console)
    try:
        yield
    finally:
        await console.watchers.stop()
        console.watchers = None


def _event(name: str, data: object) -> str:
    return f"event: {name}\ndata: {json.dumps(data, default=str)}\n\n"


async def instance_stream(request: Request) -> Response:
    """``text/event-stream``: a ``changed`` event whenever the instance's fingerprint
    moves (the page then fetches itself again), ``gone`` if it is deleted. With
    ``?seen=<version>``, the first read is compared with the version the page shows."""
    console = console_of(request)
    instance_id = request.path_params["instance_id"]
    seen_version = request.query_params.get("seen")
    if seen_version is not None and not VERSION.fullmatch(seen_version):
        raise HTTPException(400, f"seen={seen_version[:40]!r} is not a page version (16 hex digits)")

    async def fingerprint() -> dict[str, Any] | None:
        row = await console.read(lambda conn: console_sql.instance_fingerprint(conn, instance_id))
        return None if row is None else dict(row._asdict())

    watchers = console.watchers
    assert watchers is not None, "the console is not started"
    if watchers.count >= console.settings.max_streams:
        raise HTTPException(503, f"{watchers.count} live-update streams are open, the most this console serves")
    first = await fingerprint()
    if first is None:  # nothing to watch: a stream would stay open for ever
        raise HTTPException(404, f"no instance {instance_id!r}")

    async def stream() -> AsyncIterator[str]:
        watchers.join()
        try:
            yield f"retry: {RETRY_MILLISECONDS}\n" + _event("hello", first)
            if seen_version is not None and seen_version != _version_of(first):
                # it moved after the page was rendered, before this stream began
                yield _event("changed", first)
            seen_state: dict[str, Any] | None = first
            seen = console.changes.generation
            quiet = 0.0
            while True:
                seen_generation = await console.changes.wait(seen, POLL_SECONDS)
                woke = seen_generation != seen
                seen = seen_generation
                quiet = 0.0 if woke else quiet + POLL_SECONDS
                try:
                    state = await fingerprint()
                except Exception as error:
                    if not is_unavailable(error):
                        raise
                    # the database went away: end the stream, the browser reconnects later
                    _log.warning("console.database_unavailable", path=request.url.path, error=repr(error))
                    yield f"retry: {RETRY_MILLISECONDS * 5}\n\n"
                    return
                if state != seen_state:
                    seen_state = state
                    yield _event("changed" if state is not None else "gone", state)
                    quiet = 0.0
                    if state is None:
                        return
                elif quiet >= KEEPALIVE_SECONDS:
                    quiet = 0.0
                    yield ": keepalive\n\n"
        finally:
            watchers.leave()

    return StreamingResponse(
        stream(),
        media_type="text/event-stream",
        headers={"cache-control": "no-store", "x-accel-buffering": "no"},
    )


def routes() -> list[BaseRoute]:
    return [Route("/live/{instance_id:path}", instance_stream, methods=["GET"])]
