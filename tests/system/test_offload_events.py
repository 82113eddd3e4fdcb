"""Large CloudEvents where the object store meets the sealed inbox (issue 36): an event's
data above ``KENNING_OFFLOAD_BYTES`` leaves its inbox row at the ingress (a reference under
``%shared``), with and without encryption keys, and ``wait_event(match=...)`` still takes
exactly the right event, whether the wait was there first or subscribed after the event
arrived; the object outlives the inbox row while a history references it. Real ingress,
worker and scheduler processes against a real S3 server (SeaweedFS)."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import psycopg
import pytest

from kenning import Client, codecs
from kenning.db import Database
from kenning.objects import payloads
from tests.ingress_support import Ingress, binary, cloud_event, start_ingress
from tests.objects_support import S3Server, seaweedfs
from tests.ports import free_port
from tests.scheduler_support import spawn_scheduler
from tests.support import ProcessPool, eventually

APP = "tests.apps.sealed_events"
EVENT = "order.paid"
KEY = "k1:" + base64.b64encode(b"\x01" * 32).decode()
THRESHOLD = 256 * 1024
PAD = "p" * (400 * 1024)  # 400 KiB of data: above the threshold, below the ingress's 1 MB
Sql = psycopg.Connection[tuple[object, ...]]


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with seaweedfs(tmp_path_factory.mktemp("s3")) as server:
        yield server


@pytest.fixture(autouse=True)
def fresh_payload_settings() -> Iterator[None]:
    """This process reads the store and the keys once: each test reads its own."""
    payloads.reset()
    codecs.reset()
    yield
    payloads.reset()
    codecs.reset()


def store_env(s3: S3Server, keys: str) -> dict[str, str]:
    env = {**s3.env, "KENNING_OBJECT_STORE": s3.url(), "KENNING_OFFLOAD_BYTES": str(THRESHOLD)}
    return {**env, "KENNING_ENCRYPTION_KEYS": keys} if keys else env


def post(ingress: Ingress, data: dict[str, object]) -> httpx.Response:
    headers, body = binary(cloud_event(EVENT, data, source="tests/offload-events"))
    return httpx.post(f"{ingress.url}/events", headers=headers, content=body, timeout=60)


def accepted(ingress: Ingress, data: dict[str, object]) -> None:
    answer = post(ingress, data)
    assert answer.status_code == 202, answer.text


def shared_reference(value: object, s3: S3Server) -> str:
    """The object key a row's reference names: one of the objects many rows may share."""
    assert isinstance(value, dict) and set(value) == {"$ref", "size", "sha256"}, str(value)[:200]
    key = str(value["$ref"]).removeprefix(f"s3://{s3.bucket}/")
    assert key.startswith("kenning/%shared/"), key
    return key


async def status_is(sql: Sql, instance_id: str, status: str) -> None:
    await eventually(
        lambda: (
            sql.execute("SELECT status FROM kenning_instances WHERE id = %s", (instance_id,)).fetchone() == (status,)
        ),
        timeout=90,
        message=f"{instance_id} {status}",
    )


@pytest.mark.parametrize("keys", ["", KEY], ids=["plain", "encrypted"])
async def test_a_large_event_leaves_its_inbox_row_and_a_match_takes_exactly_it(
    database: Database,
    database_url: str,
    processes: ProcessPool,
    sql: Sql,
    s3: S3Server,
    monkeypatch: pytest.MonkeyPatch,
    keys: str,
) -> None:
    env = store_env(s3, keys)
    for name, value in env.items():
        monkeypatch.setenv(name, value)  # the test's client reads as the processes do
    ingress = start_ingress(processes, database_url, env=env)
    worker = processes.worker(database_url, APP, env=env)
    await eventually(lambda: '"worker.started"' in processes.log_of(worker), timeout=60, message="worker up")

    # events already in the inbox when the wait subscribes: an older one of another order
    # first, so a wait that took "any large event" would take the wrong one
    accepted(ingress, {"order": "other", "n": 0, "pad": PAD})
    accepted(ingress, {"order": "late", "n": 1, "pad": PAD})
    rows = sql.execute("SELECT data FROM kenning_inbox WHERE event_type = %s ORDER BY id", (EVENT,)).fetchall()
    assert len(rows) == 2
    keys_in_store = {shared_reference(row[0], s3) for row in rows}  # the rows keep references only
    assert keys_in_store <= set(s3.object_keys("kenning/%shared/"))

    async with Client(database=database) as client:
        late = await client.start("sealed.takes_one", order="late")
        await status_is(sql, late.instance_id, "completed")
        assert await client.result(late.instance_id, timeout=60) == 1

        # a wait already waiting when its event arrives, another order's event first
        early = await client.start("sealed.takes_one", order="early")
        await status_is(sql, early.instance_id, "waiting_for_event")
        accepted(ingress, {"order": "not-early", "n": 2, "pad": PAD})
        accepted(ingress, {"order": "early", "n": 3, "pad": PAD})
        await status_is(sql, early.instance_id, "completed")
        assert await client.result(early.instance_id, timeout=60) == 3

    # the history keeps a reference too, readable after inbox retention removed the rows
    # and the sweep ran: the object outlives the inbox row that brought it
    history = sql.execute(
        "SELECT payload FROM kenning_history WHERE instance_id = %s AND kind = 'EventReceived'", (late.instance_id,)
    ).fetchall()
    assert len(history) == 1
    kept = shared_reference(history[0][0]["data"], s3)  # type: ignore[index]
    sql.execute("UPDATE kenning_inbox SET processed_at = now() - interval '30 days' WHERE status = 'processed'")
    retention = processes.worker(
        database_url, APP, "--inbox-retention-seconds", "60", "--inbox-cleanup-interval", "0.5", env=env
    )
    await eventually(
        lambda: sql.execute("SELECT count(*) FROM kenning_inbox WHERE event_type = %s", (EVENT,)).fetchone() == (0,),
        timeout=60,
        message="inbox retention",
    )
    retention.terminate()
    sweep_env = {**env, "KENNING_OBJECT_SWEEP_GRACE": "1", "KENNING_OBJECT_SWEEP_INTERVAL": "0.5"}
    spawn_scheduler(processes, database_url, env=sweep_env)
    unreferenced = keys_in_store - {kept}
    await eventually(
        lambda: not (unreferenced & set(s3.object_keys("kenning/%shared/"))),
        timeout=60,
        message="the inbox rows' objects swept with their rows",
    )
    assert kept in s3.object_keys("kenning/%shared/")
    opened = codecs.unseal(history[0][0]["data"])  # type: ignore[index]
    assert opened == {"order": "late", "n": 1, "pad": PAD}


async def test_an_ingress_whose_store_is_away_answers_one_json_line_and_stores_nothing(
    database_url: str, processes: ProcessPool, sql: Sql, s3: S3Server
) -> None:
    away = {**store_env(s3, ""), "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}
    ingress = start_ingress(processes, database_url, env=away)
    answer = post(ingress, {"order": "away", "n": 0, "pad": PAD})
    assert answer.status_code == 503, answer.text
    body = answer.json()
    assert body["error_type"] == "object_store_unavailable" and body["retryable"] is True
    assert "\n" not in body["error"] and "object store" in body["error"]
    assert sql.execute("SELECT count(*) FROM kenning_inbox").fetchone() == (0,)
    # a small event needs no store: accepted
    small = post(ingress, {"order": "away", "n": 1})
    assert small.status_code == 202, small.text


async def test_an_ingress_without_a_store_keeps_a_large_event_inline_and_the_wait_takes_it(
    database: Database, database_url: str, processes: ProcessPool, sql: Sql, s3: S3Server
) -> None:
    ingress = start_ingress(processes, database_url, env={"KENNING_OFFLOAD_BYTES": str(THRESHOLD)})
    env = store_env(s3, "")
    worker = processes.worker(database_url, APP, env=env)
    await eventually(lambda: '"worker.started"' in processes.log_of(worker), timeout=60, message="worker up")
    accepted(ingress, {"order": "inline", "n": 7, "pad": PAD})
    (data,) = sql.execute("SELECT data FROM kenning_inbox WHERE event_type = %s", (EVENT,)).fetchone() or (None,)
    assert isinstance(data, dict) and data["order"] == "inline" and len(data["pad"]) == len(PAD)
    async with Client(database=database) as client:
        started = await client.start("sealed.takes_one", order="inline")
        await status_is(sql, started.instance_id, "completed")
        assert await client.result(started.instance_id, timeout=60) == 7


@pytest.mark.parametrize("keys", ["", KEY], ids=["plain", "encrypted"])
async def test_a_batch_of_large_events_holds_every_one(
    database: Database,
    database_url: str,
    processes: ProcessPool,
    sql: Sql,
    s3: S3Server,
    monkeypatch: pytest.MonkeyPatch,
    keys: str,
) -> None:
    """A batch workflow's input gathers its events: sealed, or offloaded with the first
    large one, it must still take the next ones (sealed.batch: five per batch)."""
    env = store_env(s3, keys)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    ingress = start_ingress(processes, database_url, env=env)
    worker = processes.worker(database_url, APP, env=env)
    await eventually(lambda: '"worker.started"' in processes.log_of(worker), timeout=60, message="worker up")
    for n in range(5):
        headers, body = binary(cloud_event("sealed.batch", {"tenant": "big", "n": n, "pad": PAD}))
        answer = httpx.post(f"{ingress.url}/", headers=headers, content=body, timeout=60)
        assert answer.status_code == 202, answer.text
    rows = sql.execute("SELECT id FROM kenning_instances WHERE workflow_name = 'sealed.batch'").fetchall()
    assert len(rows) == 1
    (instance_id,) = rows[0]
    await status_is(sql, str(instance_id), "completed")
    async with Client(database=database) as client:
        batch = await client.result(str(instance_id), timeout=60)
    assert [event["n"] for event in batch] == [0, 1, 2, 3, 4]
    assert all(event["pad"] == PAD for event in batch)


async def test_a_debounced_burst_keeps_its_latest_input_sealed(
    database: Database,
    database_url: str,
    processes: ProcessPool,
    sql: Sql,
    s3: S3Server,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A start joining a burst replaces its input: sealed like the first one, never in
    plain text (tests/apps/flow.py: doc.edited, debounced by doc)."""
    env = store_env(s3, KEY)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    ingress = start_ingress(processes, database_url, env=env)
    worker = processes.worker(database_url, "tests.apps.flow", env=env)
    await eventually(lambda: '"worker.started"' in processes.log_of(worker), timeout=60, message="worker up")
    doc = "secret-document-marker"
    for n in range(3):
        headers, body = binary(cloud_event("doc.edited", {"doc": doc, "n": n}))
        answer = httpx.post(f"{ingress.url}/", headers=headers, content=body, timeout=60)
        assert answer.status_code == 202, answer.text
    rows = sql.execute("SELECT id FROM kenning_instances WHERE workflow_name = 'doc.edited'").fetchall()
    assert len(rows) == 1
    instance_id = str(rows[0][0])
    await status_is(sql, instance_id, "completed")
    stored = sql.execute("SELECT input::text FROM kenning_instances WHERE id = %s", (instance_id,)).fetchone()
    assert stored is not None and doc not in str(stored[0]) and '"$enc"' in str(stored[0])
    async with Client(database=database) as client:
        assert await client.result(instance_id, timeout=60) == {"doc": doc, "n": 2}
