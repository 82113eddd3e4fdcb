"""What the codec boundary's offload left open (issue 36, the second pass), against a real
S3 server (SeaweedFS) and real worker, scheduler and console processes: a child's result
its parent took outlives the child's retention; an event whose data cannot reach the
store waits undelivered and is delivered once it can; ``--object-store`` on a process
other than the worker is honoured as the variable is."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Iterator

import httpx
import psycopg
import pytest

from kenning import Client, codecs
from kenning.db import Database
from kenning.objects import payloads
from kenning.storage.inbox import NewEvent, inbox_insert_events
from tests.apps.offload import blob
from tests.console_support import console_ready, post_form
from tests.logguard import expect_log
from tests.objects_support import S3Server, seaweedfs
from tests.ports import free_port, free_ports
from tests.scheduler_support import spawn_scheduler
from tests.support import ProcessPool, eventually

APP = "tests.apps.offload"
KEY = "k1:" + base64.b64encode(b"\x01" * 32).decode()
Sql = psycopg.Connection[tuple[object, ...]]
SWEEPING = {
    "KENNING_OBJECT_SWEEP_GRACE": "1",
    "KENNING_OBJECT_SWEEP_INTERVAL": "0.5",
    "KENNING_RETENTION_INTERVAL": "0.5",
}


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with seaweedfs(tmp_path_factory.mktemp("s3")) as server:
        yield server


@pytest.fixture(autouse=True)
def fresh_payload_settings() -> Iterator[None]:
    """The process reads KENNING_OBJECT_STORE (and KENNING_ENCRYPTION_KEYS) once: each
    test reads its own."""
    payloads.reset()
    codecs.reset()
    yield
    payloads.reset()
    codecs.reset()


@pytest.fixture
def store_env(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = {**s3.env, "KENNING_OBJECT_STORE": s3.url(), "KENNING_OFFLOAD_BYTES": "65536"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)  # the test's client writes and reads the store as the processes do
    return env


async def _worker(processes: ProcessPool, database_url: str, env: dict[str, str], *extra: str) -> None:
    worker = processes.worker(database_url, APP, *extra, env=env)
    await eventually(lambda: '"worker.started"' in processes.log_of(worker), timeout=60, message="worker up")


def _status(sql: Sql, instance_id: str) -> object:
    row = sql.execute("SELECT status FROM kenning_instances WHERE id = %s", (instance_id,)).fetchone()
    return None if row is None else row[0]


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
async def test_a_childs_result_its_parent_took_outlives_the_childs_retention(
    database: Database,
    database_url: str,
    processes: ProcessPool,
    sql: Sql,
    s3: S3Server,
    store_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    encrypted: bool,
) -> None:
    """The parent's history keeps the child's result by the child's reference: retention
    of the child (its workflow's, shorter than the parent's) keeps that object, and the
    sweep deletes it only once the parent is gone too. Under encryption too: the child's
    end is recorded as its row keeps it (its result sealed by the child), so the reference
    stays in sight of the sweep rather than inside an envelope of the parent's."""
    if encrypted:
        store_env = {**store_env, codecs.KEYS_VARIABLE: KEY}
        monkeypatch.setenv(codecs.KEYS_VARIABLE, KEY)  # the test's client opens the parent's result
        codecs.reset()
    await _worker(processes, database_url, store_env)
    size = 400_000
    async with Client(database=database) as client:
        parent = (await client.start("large_child_result", size=size, seed="kept-child")).instance_id
        assert await client.result(parent, timeout=120) == hashlib.sha256(blob(size, "kept-child").encode()).hexdigest()
    (child,) = [str(r[0]) for r in sql.execute("SELECT id FROM kenning_instances WHERE parent_id = %s", (parent,))]
    urls = {
        str(r[0])
        for r in sql.execute(
            """SELECT jsonb_path_query(payload, 'strict $.**."$ref"') #>> '{}' FROM kenning_history
               WHERE instance_id = %s""",
            (parent,),
        )
    }
    taken = [u.removeprefix(f"s3://{s3.bucket}/") for u in urls if u != f"s3://{s3.bucket}/kenning/{parent}/"]
    taken = [key for key in taken if not key.startswith(f"kenning/{parent}/")]
    assert taken, urls  # the parent's history names an object of its child
    assert all(key.startswith(f"kenning/{child}/") for key in taken), taken  # the child's own, not a copy
    assert all(key in s3.object_keys() for key in taken)
    folder = taken[0].rsplit("/", 1)[0]
    spawn_scheduler(processes, database_url, env={**store_env, **SWEEPING})
    # the child expires on its own workflow's retention; the parent is kept
    sql.execute("UPDATE kenning_workflow_definitions SET retention_seconds = 60 WHERE workflow_name = 'large_values'")
    sql.execute("UPDATE kenning_instances SET finished_at = now() - interval '1 day' WHERE id = %s", (child,))
    await eventually(lambda: _status(sql, child) is None, timeout=60, message="the child expired")
    orphan = f"{folder}/{'0' * 64}"  # a sweep after the expiry: this one is swept, the taken result kept
    s3.client().put_object(Bucket=s3.bucket, Key=orphan, Body=b'"lost"')
    await eventually(lambda: orphan not in s3.object_keys(), timeout=60, message="a sweep after the expiry")
    assert all(key in s3.object_keys() for key in taken), "the parent's history names an object retention deleted"
    for key in taken:  # and it is the value the parent took
        body = s3.client().get_object(Bucket=s3.bucket, Key=key)["Body"].read()
        assert hashlib.sha256(body).hexdigest() == key.rsplit("/", 1)[1]
        assert codecs.is_sealed(json.loads(body)) is encrypted  # sealed by the child's worker, under the key
    # the parent expires: nothing references the child's object any more, the sweep deletes it
    sql.execute(
        "UPDATE kenning_workflow_definitions SET retention_seconds = 60 WHERE workflow_name = 'large_child_result'"
    )
    sql.execute("UPDATE kenning_instances SET finished_at = now() - interval '1 day' WHERE id = %s", (parent,))
    await eventually(lambda: _status(sql, parent) is None, timeout=60, message="the parent expired")
    assert all(key in s3.object_keys() for key in taken)  # the child's end, processed, is still in the inbox
    sql.execute("DELETE FROM kenning_inbox WHERE event_id = %s AND status = 'processed'", (child,))  # its retention
    await eventually(
        lambda: not any(key in s3.object_keys() for key in taken), timeout=60, message="the child's object swept"
    )


async def test_an_event_whose_data_cannot_reach_the_store_waits_and_is_delivered_later(
    database: Database, database_url: str, processes: ProcessPool, sql: Sql, s3: S3Server, store_env: dict[str, str]
) -> None:
    """A store failure while the inbox delivers an event: one error line each time, the
    row left pending with its attempt not counted (never parked ``failed``, even past
    ``--inbox-max-attempts``), and the waiting instance takes the event once a worker
    reaches the store."""
    expect_log("worker.object_store_unavailable")  # said at its start
    expect_log("inbox.object_store_unavailable")
    down = {**store_env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_ports(1)}"}  # nothing listens there
    await _worker(processes, database_url, down, "--inbox-max-attempts", "1", "--inbox-retry-seconds", "0.2")
    failing = processes.procs[-1]
    text = blob(300_000, "event")
    async with Client(database=database) as client:
        instance_id = (await client.start("large_event")).instance_id
        await eventually(lambda: _status(sql, instance_id) == "waiting_for_event", timeout=60, message="waiting")
        async with database.connection() as conn:
            (stored,) = await inbox_insert_events(
                conn, [NewEvent(source="/t", event_id="big-1", event_type="offload.big", data={"text": text})]
            )
        assert stored
        log = failing[1]
        await eventually(
            lambda: log.read_text().count('"inbox.object_store_unavailable"') >= 3,
            timeout=60,
            message="delivery tried against the store three times",
        )
        lines = [json.loads(x) for x in log.read_text().splitlines() if '"inbox.object_store_unavailable"' in x]
        assert all("does not answer" in x["error"] and "\n" not in x["error"] for x in lines), lines
        assert '"inbox.failed"' not in log.read_text() and "Traceback" not in log.read_text()
        assert sql.execute("SELECT status FROM kenning_inbox WHERE event_id = 'big-1'").fetchone() == ("pending",)
        assert _status(sql, instance_id) == "waiting_for_event"
        failing[0].terminate()
        failing[0].wait(timeout=30)
        await _worker(processes, database_url, store_env)  # a worker that reaches the store
        assert await client.result(instance_id, timeout=120) == hashlib.sha256(text.encode()).hexdigest()


async def test_a_console_given_the_store_by_its_flag_offloads_and_previews_a_large_input(
    database_url: str, processes: ProcessPool, sql: Sql, s3: S3Server
) -> None:
    """``--object-store`` and ``--offload-bytes`` on the console (no variable set): an
    instance it starts keeps its large input in the store, and its page previews it."""
    port = free_port()
    store_flags = ["--object-store", s3.url(), "--offload-bytes", "65536"]
    console = processes.spawn(
        ["console", "--port", str(port), "--no-migrate", "--app", APP, *store_flags],
        env={"KENNING_DATABASE_URL": database_url, "KENNING_ADMIN_TOKEN": "", **s3.env},  # credentials only
        name="console",
    )
    url = f"http://127.0.0.1:{port}"
    await console_ready(url, console)
    text = blob(300_000, "console-input")
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        fields = {
            "workflow": "every_kind",
            "input": json.dumps({"text": text, "size": 10, "seed": "c"}),
            "instance_id": "",
            "idempotency_key": "",
        }
        review = await post_form(http, "/start", {**fields, "step": "review"})
        assert review.status_code == 200, review.text[:500]
        found = re.search(r'name="instance_id" value="([^"]+)"', review.text)
        assert found is not None
        started = await post_form(http, "/start", {**fields, "instance_id": found[1], "step": "confirm"})
        assert started.status_code == 303, started.text[:500]
        instance_id = found[1]
        (stored,) = sql.execute("SELECT input FROM kenning_instances WHERE id = %s", (instance_id,)).fetchone() or (
            None,
        )
        assert isinstance(stored, dict) and set(stored) == {"$ref", "size", "sha256"}, str(stored)[:200]
        assert str(stored["$ref"]).startswith(f"s3://{s3.bucket}/kenning/")
        page = await http.get(f"/instances/{instance_id}")
        assert page.status_code == 200
        assert blob(200, "console-input") in page.text and blob(20_000, "console-input") not in page.text
