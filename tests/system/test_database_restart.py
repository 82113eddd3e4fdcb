"""A PostgreSQL restart under a client's calls (issue 33, item 5): every ``request`` and
``send_message`` either succeeds or raises a ``KenningError``, never psycopg's own
exception, and a message retried with its id is taken once.

A private embedded PostgreSQL (``tests/chaos_postgres.py``) the test crashes and starts
again (``pg_ctl -m immediate``, a power cut) twice, while a loop of 200 calls with ids runs
against a real worker process. The workflow returns every message it took, in order: a
message delivered twice would show twice. A call that raised is sent again afterwards
with the same id, as its error message says to.

Before the fix 46 of 202 such calls raised ``OperationalError``, ``AdminShutdown`` or
``PoolTimeout``, which ``except KenningError`` does not catch.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import psycopg

from kenning import Client, DatabaseUnavailableError, KenningError
from kenning.db.migrate import migrate
from kenning.hosting.embedded import with_database
from tests.chaos_postgres import owned_postgres
from tests.support import ProcessPool, workers_started

APP = "tests.apps.requests"
CALLS = 200
LANES = 8  # calls in flight at once: call n runs in lane n % LANES, one after another
IMPATIENT = 2  # lanes whose client does not retry (retry_seconds=0): they see the error
RESTART_AT = (CALLS // 4, 3 * CALLS // 4)  # calls begun when the server is crashed


async def call(client: Client, instance_id: str, n: int) -> None:
    """Call ``n``: a request when odd, a plain message when even, each with an id of its own."""
    if n % 2:
        assert await client.request(instance_id, "in", {"n": n}, request_id=f"r-{n}", timeout=60) == {"n": n}
    else:
        await client.send_message(instance_id, "in", {"n": n}, message_id=f"m-{n}")


async def test_calls_across_a_restart_succeed_or_raise_kenning_errors_and_deliver_once(
    tmp_path: Path, processes: ProcessPool
) -> None:
    with owned_postgres(tmp_path / "pg") as pg:
        url = with_database(pg.url, "kenning_restart")
        with psycopg.connect(with_database(pg.url, "postgres"), autocommit=True) as admin:
            admin.execute('CREATE DATABASE "kenning_restart"')
        migrate(url)
        worker = processes.worker(url, APP)
        await workers_started(processes, [worker])
        async with Client(url) as client, Client(url, retry_seconds=0) as impatient:
            echo = (await client.start("requests.echo", count=CALLS)).instance_id
            raised: dict[int, KenningError] = {}
            windows: list[tuple[float, float]] = []
            began: dict[int, float] = {}
            restarts: list[asyncio.Future[None]] = []

            def restart() -> None:
                start = time.monotonic()
                pg.restart()
                windows.append((start, time.monotonic()))

            async def lane(number: int) -> None:
                caller = impatient if number < IMPATIENT else client
                for n in range(number, CALLS, LANES):
                    if len(began) in RESTART_AT:
                        restarts.append(asyncio.ensure_future(asyncio.to_thread(restart)))
                    began[n] = time.monotonic()
                    try:
                        await call(caller, echo, n)
                    except KenningError as error:  # anything else fails the test here
                        raised[n] = error

            await asyncio.gather(*(lane(number) for number in range(LANES)))
            await asyncio.gather(*restarts)
            assert len(windows) == len(RESTART_AT)
            during = [n for n, at in began.items() if any(start <= at <= end for start, end in windows)]
            assert during, "no call began while the server was down: the restarts came too late"
            assert raised, "the client without retries met no restart"
            assert all(isinstance(e, DatabaseUnavailableError) for e in raised.values()), raised
            assert all("try again with" in str(e) for e in raised.values()), raised
            assert all(n % LANES < IMPATIENT for n in raised), "a retrying client gave up"
            for n in sorted(raised):  # sent again with the same id, as the error says
                await call(client, echo, n)
            taken = await client.result(echo, timeout=60)
        assert sorted(taken) == list(range(CALLS)), f"taken twice or never: {len(taken)} taken"
        print(f"calls begun while down: {len(during)}, raised without retries: {len(raised)}")
