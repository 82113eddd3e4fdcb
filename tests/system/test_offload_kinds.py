"""Every kind of payload leaves its row above ``KENNING_OFFLOAD_BYTES`` (issue 36, item 2),
against a real S3 server (SeaweedFS) and real worker, client and scheduler processes: an
input, a published value, a stream entry, a message, a request's reply; the offload is at
the codec boundary (``kenning.objects.payloads``), so every reader gets the value back and
retention deletes every kind's objects with their instance."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable, Iterator

import httpx
import psycopg
import pytest

from kenning import Client, codecs
from kenning.db import Database
from kenning.objects import payloads
from tests.apps.offload import blob
from tests.console_support import console_ready, spawn_console
from tests.logguard import expect_log
from tests.objects_support import S3Server, seaweedfs
from tests.ports import free_ports
from tests.relayer_support import relayer_process, start_receiver
from tests.scheduler_support import spawn_scheduler
from tests.support import ProcessPool, eventually, run_kenning

APP = "tests.apps.offload"
SIZE = 2 * 1024 * 1024
Sql = psycopg.Connection[tuple[object, ...]]


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with seaweedfs(tmp_path_factory.mktemp("s3")) as server:
        yield server


@pytest.fixture(autouse=True)
def fresh_payload_settings() -> Iterator[None]:
    """The process reads KENNING_OBJECT_STORE once: each test reads its own."""
    payloads.reset()
    yield
    payloads.reset()


@pytest.fixture
def store_env(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = {**s3.env, "KENNING_OBJECT_STORE": s3.url(), "KENNING_OFFLOAD_BYTES": "65536"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)  # the test's client writes and reads the store as the processes do
    return env


async def _worker(processes: ProcessPool, database_url: str, env: dict[str, str]) -> None:
    worker = processes.worker(database_url, APP, env=env)
    await eventually(lambda: '"worker.started"' in processes.log_of(worker), timeout=60, message="worker up")


def _one(sql: Sql, query: str, *params: object) -> object:
    rows = sql.execute(query, params).fetchall()
    assert len(rows) == 1, rows
    return rows[0][0]


def _status_is(sql: Sql, instance_id: str, status: str) -> Callable[[], bool]:
    return lambda: (
        sql.execute("SELECT status FROM kenning_instances WHERE id = %s", (instance_id,)).fetchone() == (status,)
    )


def _reference(value: object, s3: S3Server, instance_id: str) -> str:
    """The object key of a row's reference, which must live with the instance's objects."""
    assert isinstance(value, dict) and set(value) == {"$ref", "size", "sha256"}, str(value)[:200]
    key = str(value["$ref"]).removeprefix(f"s3://{s3.bucket}/")
    assert key.startswith(f"kenning/{instance_id}/"), key
    return key


async def test_every_payload_kind_leaves_its_row_is_read_back_and_expires_with_its_instance(
    database: Database, database_url: str, processes: ProcessPool, sql: Sql, s3: S3Server, store_env: dict[str, str]
) -> None:
    await _worker(processes, database_url, store_env)
    text = blob(SIZE, "input")
    async with Client(database=database) as client:
        started = await client.start("every_kind", text=text, size=SIZE, seed="kinds")  # a 2 MB input
        instance_id = started.instance_id
        # the published value and the stream entry, 2 MB each, read back by the client
        assert await client.get_value(instance_id, "big", timeout=120) == blob(SIZE, "kinds-value")
        entries = [entry.value async for entry in client.read_stream(instance_id, "big")]
        assert entries == [blob(SIZE, "kinds-entry")]
        await client.send_message(instance_id, "big", blob(SIZE, "message"))  # a 2 MB message
        reply = await client.request(instance_id, "ask", {"size": SIZE}, timeout=120)  # and a 2 MB reply
        assert reply == blob(SIZE, "kinds-reply")
        result = await client.result(instance_id, timeout=120)
    assert result == {
        "input": hashlib.sha256(text.encode()).hexdigest(),
        "message": hashlib.sha256(blob(SIZE, "message").encode()).hexdigest(),
    }
    # each row keeps a reference to an object of the instance
    keys = {
        _reference(_one(sql, "SELECT input FROM kenning_instances WHERE id = %s", instance_id), s3, instance_id),
        _reference(
            _one(sql, "SELECT value FROM kenning_values WHERE instance_id = %s AND key = 'big'", instance_id),
            s3,
            instance_id,
        ),
        _reference(
            _one(sql, "SELECT value FROM kenning_stream_entries WHERE instance_id = %s", instance_id), s3, instance_id
        ),
        _reference(
            _one(sql, "SELECT data FROM kenning_messages WHERE instance_id = %s AND topic = 'big'", instance_id),
            s3,
            instance_id,
        ),
        _reference(_one(sql, "SELECT value FROM kenning_replies WHERE instance_id = %s", instance_id), s3, instance_id),
    }
    assert len(keys) == 5 and keys <= set(s3.object_keys(f"kenning/{instance_id}/"))
    for column, table in (("value", "kenning_values"), ("value", "kenning_stream_entries")):
        size = _one(sql, f"SELECT pg_column_size({column}) FROM {table} WHERE instance_id = %s", instance_id)
        assert isinstance(size, int) and size < 1000  # the row holds the reference, not the value

    # the sweep keeps what rows reference; retention deletes every kind's objects
    scheduler_env = {
        **store_env,
        "KENNING_OBJECT_SWEEP_GRACE": "1",
        "KENNING_OBJECT_SWEEP_INTERVAL": "0.5",
        "KENNING_RETENTION_INTERVAL": "0.5",
    }
    orphan = f"kenning/{instance_id}/{'0' * 64}"  # what a commit that failed leaves
    s3.client().put_object(Bucket=s3.bucket, Key=orphan, Body=b'"lost"')
    spawn_scheduler(processes, database_url, env=scheduler_env)
    await eventually(lambda: orphan not in s3.object_keys(), timeout=60, message="the orphan swept")
    assert keys <= set(s3.object_keys(f"kenning/{instance_id}/"))
    sql.execute("UPDATE kenning_workflow_definitions SET retention_seconds = 60 WHERE workflow_name = 'every_kind'")
    sql.execute("UPDATE kenning_instances SET finished_at = now() - interval '1 day' WHERE id = %s", (instance_id,))
    await eventually(lambda: s3.object_keys(f"kenning/{instance_id}/") == [], timeout=60, message="objects deleted")


async def test_sealed_bytes_above_the_threshold_leave_their_rows_and_come_back_whole(
    database: Database,
    database_url: str,
    processes: ProcessPool,
    sql: Sql,
    s3: S3Server,
    store_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With keys, an activity's ``bytes`` result and an outbox event's binary data are
    sealed as JSON envelopes, so a large one is offloaded like any value: the replay reads
    the result back from the store, and the relayer publishes the bytes sent."""
    keys = {codecs.KEYS_VARIABLE: "k1:" + base64.b64encode(b"\x01" * 32).decode()}
    monkeypatch.setenv(codecs.KEYS_VARIABLE, keys[codecs.KEYS_VARIABLE])
    codecs.reset()
    env = {**store_env, **keys}
    await _worker(processes, database_url, env)
    size = 200_000  # above KENNING_OFFLOAD_BYTES (65536) once sealed
    data = b"\xff" + blob(size, "bytes").encode()
    try:
        async with Client(database=database) as client:
            started = await client.start("large_bytes_then_receive", size=size, seed="bytes")
            instance_id = started.instance_id
            await eventually(_status_is(sql, instance_id, "waiting_for_message"), timeout=120, message="waiting")
            await client.send_message(instance_id, "go", None)
            assert await client.result(instance_id, timeout=120) == hashlib.sha256(data).hexdigest()
    finally:
        codecs.reset()
    stored = _one(
        sql, "SELECT payload -> 'data' FROM kenning_history WHERE instance_id = %s AND payload ? 'bytes'", instance_id
    )
    _reference(stored, s3, instance_id)
    _reference(_one(sql, "SELECT data FROM kenning_outbox WHERE instance_id = %s", instance_id), s3, instance_id)
    assert _one(sql, "SELECT octet_length(data_bytes) FROM kenning_outbox WHERE instance_id = %s", instance_id) == 0

    receiver = await start_receiver(processes)
    relayer_process(processes, database_url, receiver.url, env=env)
    await eventually(lambda: bool(receiver.events()), timeout=60, message="the binary event published")
    (event,) = receiver.events()
    assert base64.b64decode(event["data_base64"]) == data


async def test_a_message_whose_object_is_gone_is_one_line_and_the_instance_waits_for_it(
    database: Database, database_url: str, processes: ProcessPool, sql: Sql, s3: S3Server, store_env: dict[str, str]
) -> None:
    """An unreadable object inside a run ends the run, compensating nothing: the instance
    is replayed once the object is back (a store that is down answers the same way)."""
    expect_log("instance.object_store_unavailable")
    await _worker(processes, database_url, store_env)
    async with Client(database=database) as client:
        started = await client.start("receive_in_turn")
        instance_id = started.instance_id
        await client.send_message(instance_id, "big", blob(SIZE, "lost"))  # waits: the instance takes "first" first
        key = _reference(
            _one(sql, "SELECT data FROM kenning_messages WHERE instance_id = %s AND topic = 'big'", instance_id),
            s3,
            instance_id,
        )
        body = s3.client().get_object(Bucket=s3.bucket, Key=key)["Body"].read()
        s3.client().delete_object(Bucket=s3.bucket, Key=key)  # lost outside Kenning
        await client.send_message(instance_id, "first")
        log = processes.procs[-1][1]

        def logged() -> dict[str, str] | None:
            for line in log.read_text().splitlines():
                if '"instance.object_store_unavailable"' in line:
                    found: dict[str, str] = json.loads(line)
                    return found
            return None

        line = await eventually(logged, timeout=60, message="the unreadable object logged")
        assert line is not None
        assert "the object is missing" in line["error"] and key in line["error"] and "\n" not in line["error"]
        assert line["instance_id"] == instance_id and "Traceback" not in log.read_text()
        assert (await client.status(instance_id)).status not in ("failed", "compensating", "cancelled")
        s3.client().put_object(Bucket=s3.bucket, Key=key, Body=body)  # restored from a backup
        result = await client.result(instance_id, timeout=120)
    assert result == hashlib.sha256(blob(SIZE, "lost").encode()).hexdigest()


async def test_without_a_store_an_oversized_value_is_one_line_naming_the_setting(
    database: Database, database_url: str, processes: ProcessPool, sql: Sql, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KENNING_OBJECT_STORE", raising=False)
    await _worker(processes, database_url, {})
    async with Client(database=database) as client:
        started = await client.start("publish_oversized", size=300 * 1024)
        line = await client.result(started.instance_id, timeout=120)
    assert "published value 'big' cannot be stored" in line and "set KENNING_OBJECT_STORE" in line
    assert "\n" not in line
    assert _one(sql, "SELECT count(*) FROM kenning_values WHERE instance_id = %s", started.instance_id) == 0


async def test_a_store_that_does_not_answer_is_one_line_and_loses_nothing(
    database: Database, database_url: str, processes: ProcessPool, sql: Sql, s3: S3Server, store_env: dict[str, str]
) -> None:
    """A writer whose store is down: the CLI's start writes nothing and says so in one line;
    a worker's run is handed back, and the instance finishes once a worker reaches the store."""
    down = {**store_env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_ports(1)}"}  # nothing listens there
    cli_env = {"PATH": "/usr/bin:/bin", "KENNING_DATABASE_URL": database_url, **down}
    large_input = json.dumps({"size": 10, "seed": blob(100_000, "down")})  # above 64 KiB, below argv's 128
    refused = run_kenning(["start", "large_values", "--allow-unknown", "--input", large_input], cli_env, timeout=120)
    assert refused.returncode == 2, refused.stderr
    (line,) = refused.stderr.strip().splitlines()
    assert "does not answer" in line and "AWS_ENDPOINT_URL" in line, line
    assert _one(sql, "SELECT count(*) FROM kenning_instances") == 0  # nothing half-written

    expect_log("worker.object_store_unavailable")  # said at its start
    expect_log("instance.object_store_unavailable")
    await _worker(processes, database_url, down)
    async with Client(database=database) as client:
        started = await client.start("large_values", size=300_000, seed="down")
        log = processes.procs[-1][1]
        await eventually(
            lambda: '"instance.object_store_unavailable"' in log.read_text(), timeout=90, message="the store's error"
        )
        (logged,) = {
            json.loads(x)["error"] for x in log.read_text().splitlines() if '"instance.object_store_unavailable"' in x
        }
        assert "does not answer" in logged and "AWS_ENDPOINT_URL" in logged
        assert (await client.status(started.instance_id)).status not in ("failed", "compensating", "cancelled")
        await _worker(processes, database_url, store_env)  # a worker that reaches the store
        result = await client.result(started.instance_id, timeout=120)
    assert result["text"] == blob(300_000, "down")


async def test_a_broadcast_lives_under_shared_and_is_swept_once_no_row_references_it(
    database: Database, database_url: str, processes: ProcessPool, sql: Sql, s3: S3Server, store_env: dict[str, str]
) -> None:
    """A channel's broadcast is copied into every subscriber's mailbox: its object belongs
    to no one instance, so retention of one subscriber must not delete it; the sweep does
    once no row references it."""
    await _worker(processes, database_url, store_env)
    async with Client(database=database) as client:
        subscribers = [(await client.start("large_news")).instance_id for _ in range(2)]
        for instance_id in subscribers:
            await eventually(
                _status_is(sql, instance_id, "waiting_for_message"), timeout=60, message="subscribed and waiting"
            )
        assert await client.publish("news", blob(SIZE, "news")) == 2
        results = [await client.result(instance_id, timeout=120) for instance_id in subscribers]
    assert results == [hashlib.sha256(blob(SIZE, "news").encode()).hexdigest()] * 2
    (shared,) = {
        str(row[0]["$ref"]).removeprefix(f"s3://{s3.bucket}/")  # type: ignore[index]
        for row in sql.execute("SELECT data FROM kenning_messages WHERE topic = 'news'").fetchall()
    }
    assert shared.startswith("kenning/%shared/") and shared in s3.object_keys()

    orphan = f"kenning/%shared/{'0' * 64}"  # a broadcast whose commit failed
    s3.client().put_object(Bucket=s3.bucket, Key=orphan, Body=b'"lost"')
    scheduler_env = {
        **store_env,
        "KENNING_OBJECT_SWEEP_GRACE": "1",
        "KENNING_OBJECT_SWEEP_INTERVAL": "0.5",
        "KENNING_RETENTION_INTERVAL": "0.5",
    }
    spawn_scheduler(processes, database_url, env=scheduler_env)
    await eventually(lambda: orphan not in s3.object_keys(), timeout=60, message="the orphan swept")
    assert shared in s3.object_keys()  # referenced by both mailboxes and histories
    # one subscriber expires: the other still references the broadcast
    sql.execute("UPDATE kenning_workflow_definitions SET retention_seconds = 60 WHERE workflow_name = 'large_news'")
    sql.execute("UPDATE kenning_instances SET finished_at = now() - interval '1 day' WHERE id = %s", (subscribers[0],))
    await eventually(
        lambda: _one(sql, "SELECT count(*) FROM kenning_instances WHERE id = %s", subscribers[0]) == 0,
        timeout=60,
        message="the first subscriber expired",
    )
    s3.client().put_object(Bucket=s3.bucket, Key=orphan, Body=b'"lost"')  # a sweep after the expiry
    await eventually(lambda: orphan not in s3.object_keys(), timeout=60, message="the second orphan swept")
    assert shared in s3.object_keys()
    sql.execute("UPDATE kenning_instances SET finished_at = now() - interval '1 day' WHERE id = %s", (subscribers[1],))
    await eventually(lambda: shared not in s3.object_keys(), timeout=60, message="the broadcast swept")


async def test_the_console_previews_a_large_input_and_streams_its_download(
    database: Database, database_url: str, processes: ProcessPool, s3: S3Server, store_env: dict[str, str]
) -> None:
    """An input is a reference as its whole column (not inside ``{"result": ...}``): the
    page shows its first bytes, read from the store, and the download streams it whole."""
    url, console = spawn_console(processes, database_url, env=s3.env)  # a reader: no KENNING_OBJECT_STORE
    text = blob(SIZE, "shown-input")
    async with Client(database=database) as client:  # no worker: the instance stays pending
        started = await client.start("every_kind", text=text, size=10, seed="shown")
    await console_ready(url, console)
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        page = await http.get(f"/instances/{started.instance_id}")
        assert page.status_code == 200
        assert blob(200, "shown-input") in page.text and blob(20_000, "shown-input") not in page.text
        download = await http.get(f"/values/{started.instance_id}", params={"of": "input"})
        assert download.status_code == 200
        assert json.loads(download.content) == {"text": text, "size": 10, "seed": "shown"}
        assert int(download.headers["content-length"]) == len(download.content)
