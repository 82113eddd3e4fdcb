"""Durable streams through real processes (issue 34, items 1 and 4): a ``kenning worker``
writes, a ``kenning ingress`` serves ``GET /instances/{id}/streams/{key}`` as Server-Sent
Events over real HTTP. A reader disconnected mid-run reconnects with ``Last-Event-ID`` and
gets every entry once, in order, then the close at the instance's end; the endpoint takes
the admin token like ``/instances``, answers bad input with one-line JSON errors, and
ends its event streams (without a close) when the ingress is asked to stop, so the
process exits and its clients resume elsewhere.

Before the feature there was no such endpoint: every test here failed (404)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import psycopg

from kenning import Client, StreamEntry
from kenning.db import Database
from tests.ingress_support import Ingress, start_ingress
from tests.relayer_support import relayer_process, start_receiver
from tests.support import REPO_ROOT, ProcessPool, check_invariants, eventually, workers_started
from tests.support import kenning_command as kenning

APP = "tests.apps.streams"
ADMIN_TOKEN = "admin-token-3"
Sql = psycopg.Connection[tuple[object, ...]]


@dataclass
class Event:
    event: str = "message"
    id: str | None = None
    data: list[str] = field(default_factory=list)

    def json(self) -> Any:
        return json.loads("\n".join(self.data))


async def sse_events(response: httpx.Response) -> AsyncIterator[Event]:
    """The events of a text/event-stream response (comments skipped)."""
    event = Event()
    async for line in response.aiter_lines():
        if not line:
            if event.data or event.id is not None:
                yield event
            event = Event()
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            event.event = value
        elif name == "id":
            event.id = value
        elif name == "data":
            event.data.append(value)


def stream_url(ingress: Ingress, instance_id: str, key: str) -> str:
    return f"{ingress.url}/instances/{instance_id}/streams/{key}"


async def test_a_reader_disconnected_mid_run_resumes_from_last_event_id(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool
) -> None:
    worker = processes.worker(database_url, APP)
    ingress = start_ingress(processes, database_url, env={"KENNING_ADMIN_TOKEN": ADMIN_TOKEN})
    await workers_started(processes, [worker])
    count = 12
    auth = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    async with Client(database=database) as client, httpx.AsyncClient(timeout=30) as http:
        instance_id = (await client.start("ticker", count=count)).instance_id
        url = stream_url(ingress, instance_id, "ticks")
        seen: list[tuple[int, Any]] = []

        # the first connection: five entries written and read live, then the reader drops
        async with http.stream("GET", url, headers=auth) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            events = sse_events(response)
            for n in range(5):
                await client.send_message(instance_id, "tick")
                event = await anext(events)
                assert (event.event, event.id) == ("entry", str(n))
                seen.append((int(event.id or -1), event.json()["value"]))
        # written while nobody reads
        for _ in range(4):
            await client.send_message(instance_id, "tick")
        await eventually(
            lambda: sql.execute("SELECT count(*) FROM kenning_stream_entries").fetchone() == (9,),
            timeout=20,
            message="nine entries",
        )
        # resumed after the last id seen: the four missed, then the rest live, then the close
        last_id = seen[-1][0]
        async with http.stream("GET", url, headers={**auth, "last-event-id": str(last_id)}) as response:
            assert response.status_code == 200
            events = sse_events(response)
            for _ in range(4):
                event = await anext(events)
                seen.append((int(event.id or -1), event.json()["value"]))
            for _ in range(count - 9):
                await client.send_message(instance_id, "tick")
                event = await anext(events)
                assert event.event == "entry"
                body = event.json()
                assert body["offset"] == int(event.id or -1) and body["attempt"] == 0 and body["step"] is None
                seen.append((body["offset"], body["value"]))
            closing = [event async for event in events]
        assert [e.event for e in closing] == ["close"]
        assert seen == [(n, n) for n in range(count)]  # every entry once, in order
        assert await client.result(instance_id, timeout=10) == count
        # ?offset= starts anywhere; a finished instance's stream is read whole and closed
        async with http.stream("GET", f"{url}?offset={count - 2}", headers=auth) as response:
            assert [(e.event, e.id) for e in [event async for event in sse_events(response)]] == [
                ("entry", str(count - 2)),
                ("entry", str(count - 1)),
                ("close", None),
            ]
    check_invariants(sql)


async def test_the_endpoint_takes_the_admin_token_refuses_bad_input_and_ends_at_shutdown(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool
) -> None:
    worker = processes.worker(database_url, APP)
    ingress = start_ingress(processes, database_url, env={"KENNING_ADMIN_TOKEN": ADMIN_TOKEN}, token="in-token")
    await workers_started(processes, [worker])
    auth = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    async with Client(database=database) as client, httpx.AsyncClient(timeout=30) as http:
        instance_id = (await client.start("ticker", count=3)).instance_id
        url = stream_url(ingress, instance_id, "ticks")

        async def answer(target: str, headers: dict[str, str]) -> tuple[int, Any]:
            response = await http.get(target, headers=headers)
            return response.status_code, response.json()

        assert (await answer(url, {}))[0] == 401
        assert (await answer(url, {"authorization": "Bearer in-token"}))[0] == 401  # events' token: not enough
        status, body = await answer(stream_url(ingress, "nobody", "ticks"), auth)
        assert (status, body["error"]) == (404, "no workflow instance 'nobody'")
        status, body = await answer(url, {**auth, "last-event-id": "seven"})
        assert status == 400 and body["error"].startswith("Last-Event-ID must be an entry's offset")
        status, body = await answer(f"{url}?offset=-1", auth)
        assert status == 400 and body["error"].startswith("offset must be a non-negative integer")
        status, body = await answer(stream_url(ingress, instance_id, "k" * 300), auth)
        assert status == 400 and "at most 256 characters" in body["error"]

        # an open stream when the ingress is asked to stop: the response ends, no close
        async with http.stream("GET", url, headers=auth) as response:
            events = sse_events(response)
            await client.send_message(instance_id, "tick")
            assert (await anext(events)).id == "0"
            ingress.process.terminate()
            rest = [event async for event in events]
        assert rest == []
        assert ingress.process.wait(timeout=20) == 0  # a requested stop exits 0


async def test_kenning_stream_read_prints_json_lines_and_follows_to_the_close(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool
) -> None:
    worker = processes.worker(database_url, APP)
    await workers_started(processes, [worker])
    async with Client(database=database) as client:
        instance_id = (await client.start("ticker", count=3)).instance_id
        await client.send_message(instance_id, "tick")
        await eventually(
            lambda: sql.execute("SELECT count(*) FROM kenning_stream_entries").fetchone() == (1,),
            timeout=20,
            message="the first entry",
        )
        # without --follow: what is written so far, then exit 0
        done = kenning("stream", "read", instance_id, "ticks", url=database_url)
        assert done.returncode == 0, done.stderr
        (line,) = done.stdout.splitlines()
        first = json.loads(line)
        assert (first["offset"], first["attempt"], first["step"], first["value"]) == (0, 0, None, 0)

        # --follow: each entry as it is written, exit 0 at the instance's end
        follower = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "kenning",
            "stream",
            "read",
            instance_id,
            "ticks",
            "--offset",
            "1",
            "--follow",
            env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin", "KENNING_DATABASE_URL": database_url},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        assert follower.stdout is not None
        lines = []
        for n in (1, 2):
            await client.send_message(instance_id, "tick")
            lines.append(json.loads(await asyncio.wait_for(follower.stdout.readline(), 20)))
            assert lines[-1]["offset"] == n
        assert await asyncio.wait_for(follower.wait(), 20) == 0
        assert await follower.stdout.read() == b""

    done = kenning("stream", "read", instance_id, "ticks", "--offset", "2", url=database_url)
    assert [json.loads(line)["value"] for line in done.stdout.splitlines()] == [2]
    # bad input: one line, exit 2
    for args, message in [
        (["nobody", "ticks"], "kenning stream: no workflow instance 'nobody'"),
        ([instance_id, "k" * 300], "kenning stream: a stream's key must be a non-empty str of at most 256 characters"),
    ]:
        done = kenning("stream", "read", *args, url=database_url)
        assert (done.returncode, done.stderr.strip()) == (2, message)
    done = kenning("stream", "read", instance_id, "ticks", "--offset", "-1", url=database_url)
    assert done.returncode == 2 and "error: argument --offset: invalid non_negative_int value: '-1'" in done.stderr


async def test_published_entries_reach_the_relayers_target_as_the_same_stream(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool
) -> None:
    receiver = await start_receiver(processes)
    worker = processes.worker(database_url, APP)
    relayer_process(processes, database_url, receiver.url)
    await workers_started(processes, [worker])
    async with Client(database=database) as client:
        instance_id = (await client.start("announced", parts=["a", "b", "c"])).instance_id
        assert await client.result(instance_id, timeout=30) == 3
        entries = [entry async for entry in client.read_stream(instance_id, "parts")]
    assert [e.value for e in entries][-1] == "kept in the stream only"
    # the last entry was not published: four outbox rows, all delivered (the outcome is
    # recorded once the receiver answered)
    await eventually(
        lambda: (
            sql.execute("SELECT count(*), count(*) FILTER (WHERE status = 'published') FROM kenning_outbox").fetchone()
            == (4, 4)
        ),
        timeout=30,
        message="four events published",
    )
    events = receiver.events()
    assert len(events) == 4
    assert [e["data"] for e in events] == [
        {
            "instance_id": instance_id,
            "key": "parts",
            "offset": entry.offset,
            "attempt": entry.attempt,
            "step": entry.step,
            "time": entry.time.isoformat(),
            "value": entry.value,
        }
        for entry in entries[:4]
    ]
    attributes = [e["attributes"] for e in events]
    assert {(a["type"], a["source"], a["subject"]) for a in attributes} == {
        ("kenning.stream.entry", f"kenning/instances/{instance_id}", "parts")
    }
    assert len({a["id"] for a in attributes}) == 4


async def test_a_worker_killed_mid_activity_leaves_its_entries_under_a_lower_attempt(
    database: Database, database_url: str, sql: Sql, processes: ProcessPool
) -> None:
    """The abandoned attempt's entries stay; the attempt that took over writes its own after
    them under a higher number, though the retry policy never counted the killed one, so a
    reader drops the lower attempt's entries of the step and keeps a whole answer."""
    lease = ("--lease-seconds", "3")
    doomed = processes.worker(database_url, APP, *lease)
    await workers_started(processes, [doomed])
    count = 6
    async with Client(database=database) as client:
        instance_id = (await client.start("slow_stream", count=count)).instance_id
        follower = asyncio.create_task(_entries(client, instance_id))
        await eventually(
            lambda: sql.execute("SELECT count(*) FROM kenning_stream_entries").fetchone() == (2,),
            timeout=20,
            message="two tokens of the first attempt",
        )
        doomed.kill()
        survivor = processes.worker(database_url, APP, *lease)
        await workers_started(processes, [survivor])
        assert await client.result(instance_id, timeout=60) == count
        entries = await asyncio.wait_for(follower, 20)  # one reader, connected throughout
    first = [e for e in entries if e.attempt == 1]
    second = [e for e in entries if e.attempt == 2]
    assert [e.value for e in first] == list(range(len(first))) and len(first) >= 2
    assert [e.value for e in second] == list(range(count))
    assert entries == first + second  # the retry's after the abandoned attempt's, offsets in order
    assert {e.step for e in entries} == {"slow_tokens:1"}
    assert [e.offset for e in entries] == list(range(len(entries)))
    kept = [e.value for e in entries if e.attempt == max(x.attempt for x in entries if x.step == e.step)]
    assert kept == list(range(count))  # the reader's rule: the step's highest attempt only
    check_invariants(sql)


async def _entries(client: Client, instance_id: str) -> list[StreamEntry]:
    return [entry async for entry in client.read_stream(instance_id, "tokens")]
