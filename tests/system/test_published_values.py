"""Published state and search through real processes (issue 29, item 3): a worker process
runs orders that publish their status and searchable customer and region, then wait for a
``go`` message. While they wait, a client in this process reads their values (no worker
involved), a ``get_value(timeout=...)`` is woken by the publish that follows the message
(the client's fallback poll is 30 s, so only the NOTIFY wakes it in time), ``kenning
instances list --where`` finds them among others (a malformed ``--where`` is one line and
exit code 2), and the console's list filters them by attribute and its instance page shows
the published values.

Before the feature ``publish_value`` did not exist: the app failed to import in the worker,
and ``--where``, ``get_value`` and the console's filter did not exist either.
"""

from __future__ import annotations

import asyncio
import json
import re
import time

import httpx
import psycopg

from kenning import Client
from kenning.db import Database
from tests.apps import published
from tests.console_support import console_ready, spawn_console
from tests.support import ProcessPool, check_invariants, eventually, kenning_command, workers_started

APP = "tests.apps.published"
Sql = psycopg.Connection[tuple[object, ...]]
ORDERS = [("o-1", "c-1", "eu"), ("o-2", "c-2", "eu"), ("o-3", "c-1", "us"), ("o-4", "c-1", "eu"), ("o-5", "c-3", "eu")]


def _waiting(sql: Sql) -> bool:
    row = sql.execute("SELECT count(*) FROM kenning_instances WHERE status = 'waiting_for_message'").fetchone()
    return row == (len(ORDERS),)


def _ids(html: str) -> list[str]:
    return re.findall(r'<td class="id" data-label="Instance"><a href="[^"]+">([^<]+)</a>', html)


def _next(html: str) -> str | None:
    found = re.search(r'<a href="([^"]+)" rel="next">', html)
    return found.group(1).replace("&amp;", "&") if found else None


async def test_values_are_read_awaited_and_searched_from_outside_the_worker(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool
) -> None:
    worker = processes.worker(database_url, APP)
    await workers_started(processes, [worker])
    async with Client(database=database, result_poll_interval=30) as client:
        for instance_id, customer, region in ORDERS:
            await client.start(published.published_order, instance_id=instance_id, customer=customer, region=region)
        await eventually(lambda: _waiting(sql), timeout=30, message="every order waits for its go")

        # read while the instance waits: the worker holds nothing of it
        status = await client.get_status("o-1")
        assert status is not None and (status.text, status.progress) == ("awaiting payment", 0.4)
        assert await client.get_value("o-1", "customer") == "c-1"

        waiter = asyncio.create_task(client.get_value("o-1", "receipt", timeout=30))
        await asyncio.sleep(0.5)
        assert not waiter.done()
        sent = time.monotonic()
        await client.send_message("o-1", "go", "card")
        assert await waiter == {"paid": "card"}
        woken_after = time.monotonic() - sent
        assert woken_after < 5, f"woken after {woken_after:.2f} s: by the 30 s poll, not the NOTIFY"
        assert await client.result("o-1", timeout=30) == {"customer": "c-1"}
        done = await client.get_status("o-1")
        assert done is not None and done.text == "paid"

    # the CLI: every --where pair holds, newest first
    found = kenning_command(
        "instances", "list", "--where", "customer=c-1", "--where", "region=eu", "--json", url=database_url
    )
    assert found.returncode == 0, found.stderr
    assert [row["id"] for row in json.loads(found.stdout)] == ["o-4", "o-1"]
    table = kenning_command("instances", "list", "--where", "customer=c-1", url=database_url)
    listed = [line.split()[0] for line in table.stdout.splitlines() if line.startswith("o-")]
    assert table.returncode == 0 and listed == ["o-4", "o-3", "o-1"], table.stdout
    malformed = kenning_command("instances", "list", "--where", "customer", url=database_url)
    assert malformed.returncode == 2
    said = "'customer' is not KEY=VALUE: a search attribute and its value, e.g. customer=c-1"
    assert malformed.stderr.strip().splitlines()[-1].endswith(said), malformed.stderr
    assert "Traceback" not in malformed.stderr
    # a declared key that matches nothing is an empty list; a key no instance holds (a typo,
    # an undeclared key) is an error naming it, not an empty list and exit 0
    none = kenning_command("instances", "list", "--where", "customer=c-9", "--json", url=database_url)
    assert none.returncode == 0 and json.loads(none.stdout) == [], none.stderr
    typo = kenning_command("instances", "list", "--where", "custmer=c-1", url=database_url)
    assert typo.returncode == 2 and typo.stdout == "", typo.stdout
    assert "no instance holds search attribute 'custmer'" in typo.stderr.strip().splitlines()[-1], typo.stderr
    shown = kenning_command("instances", "show", "o-4", "--json", url=database_url)
    assert json.loads(shown.stdout)["values"]["status"] == {"text": "awaiting payment", "progress": 0.4}
    human = kenning_command("instances", "show", "o-4", url=database_url)
    assert human.returncode == 0 and "PUBLISHED" in human.stdout and "awaiting payment" in human.stdout

    # the console: the list filtered by attribute, paged; the instance page shows the values
    url, proc = spawn_console(processes, database_url, env={"KENNING_CONSOLE_PAGE_SIZE": "2"})
    await console_ready(url, proc)
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        first = await http.get("/instances", params={"where": "customer=c-1"})
        assert first.status_code == 200, first.text
        assert _ids(first.text) == ["o-4", "o-3"]
        assert "awaiting payment (40%)" in first.text  # the status column shows set_status
        second = await http.get(_next(first.text) or "")
        assert _ids(second.text) == ["o-1"] and _next(second.text) is None
        both = await http.get(  # where= once per pair, as --where (issue 33, item 6)
            "/instances",
            params=[("where", "customer=c-1"), ("where", "region=eu"), ("status", "waiting_for_message")],
        )
        assert _ids(both.text) == ["o-4"]
        assert "Cancel all" not in both.text  # a bulk action cannot select by attribute: none offered
        plain = await http.get("/instances", params={"status": "waiting_for_message"})
        assert "Cancel all" in plain.text
        bad = await http.get("/instances", params={"where": "customer"})
        assert bad.status_code == 400 and "is not KEY=VALUE" in bad.text
        page = await http.get("/instances/o-1")
        assert page.status_code == 200
        assert "data-published" in page.text and "card" in page.text and "paid" in page.text
    assert "Traceback" not in processes.log_of(proc)
    check_invariants(sql)
