"""Large values in an object store (issue 36, item 2), against a real S3 server (SeaweedFS)
and real worker processes: a value above ``--offload-bytes`` leaves its row for the store,
the row keeping a reference; the replay, ``Client.result`` and the CLI read it back."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator

import httpx
import psycopg
import pytest

from kenning import Client, codecs
from kenning.db import Database
from kenning.errors import ObjectStoreError
from tests.apps.offload import blob
from tests.console_support import console_ready, spawn_console
from tests.logguard import expect_log
from tests.objects_support import S3Server, seaweedfs
from tests.scheduler_support import spawn_scheduler
from tests.support import ProcessPool, eventually, run_kenning

APP = "tests.apps.offload"
Sql = psycopg.Connection[tuple[object, ...]]


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with seaweedfs(tmp_path_factory.mktemp("s3")) as server:
        yield server


@pytest.fixture
def store_env(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)  # the test's own client reads the store as the processes do
    return {**s3.env, "KENNING_OBJECT_STORE": s3.url(), "KENNING_OFFLOAD_BYTES": "65536"}


async def _worker(processes: ProcessPool, database_url: str, env: dict[str, str]) -> None:
    worker = processes.worker(database_url, APP, env=env)
    await eventually(lambda: '"worker.started"' in processes.log_of(worker), timeout=60, message="worker up")


def _row_json(sql: Sql, query: str, instance_id: str) -> list[object]:
    return [row[0] for row in sql.execute(query, (instance_id,)).fetchall()]


async def test_large_step_and_workflow_results_live_in_the_store_and_are_read_back(
    database: Database, database_url: str, processes: ProcessPool, sql: Sql, s3: S3Server, store_env: dict[str, str]
) -> None:
    await _worker(processes, database_url, store_env)
    size = 3 * 1024 * 1024
    async with Client(database=database) as client:
        started = await client.start("large_values", size=size, seed="one")
        result = await client.result(started.instance_id, timeout=120)
    text = blob(size, "one")
    assert result == {"text": text, "digest": hashlib.sha256(text.encode()).hexdigest()}
    # the rows keep references, the values are objects under the instance's prefix
    steps = _row_json(
        sql, "SELECT payload FROM kenning_history WHERE instance_id = %s ORDER BY seq", started.instance_id
    )
    (stored_result,) = _row_json(sql, "SELECT result FROM kenning_instances WHERE id = %s", started.instance_id)
    large_step = steps[0]
    assert isinstance(large_step, dict) and set(large_step["result"]) == {"$ref", "size", "sha256"}
    assert isinstance(stored_result, dict) and set(stored_result["result"]) == {"$ref", "size", "sha256"}
    small_step = steps[1]
    assert isinstance(small_step, dict) and small_step["result"] == result["digest"]  # small: in its row
    keys = s3.object_keys(f"kenning/{started.instance_id}/")
    assert sorted(f"s3://{s3.bucket}/{key}" for key in keys) == sorted(
        {large_step["result"]["$ref"], stored_result["result"]["$ref"]}
    )
    assert len(json.dumps(stored_result)) < 300  # the row holds the reference, not the value


async def test_with_encryption_the_object_holds_ciphertext(
    database: Database,
    database_url: str,
    processes: ProcessPool,
    sql: Sql,
    s3: S3Server,
    store_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Offload comes after encryption on the way out: the store never sees the value."""
    keys = codecs.new_key_text("k1")
    monkeypatch.setenv(codecs.KEYS_VARIABLE, keys)
    codecs.reset()
    try:
        await _worker(processes, database_url, {**store_env, codecs.KEYS_VARIABLE: keys})
        size = 512 * 1024
        async with Client(database=database) as client:
            started = await client.start("large_values", size=size, seed="secret")
            result = await client.result(started.instance_id, timeout=120)
        assert result["text"] == blob(size, "secret")
        keys_stored = s3.object_keys(f"kenning/{started.instance_id}/")
        assert len(keys_stored) == 2
        marker = blob(64, "secret").encode()
        for key in keys_stored:
            body = s3.client().get_object(Bucket=s3.bucket, Key=key)["Body"].read()
            assert marker not in body and b'"$enc"' in body  # a sealed envelope, ciphertext inside
    finally:
        codecs.reset()


async def test_a_missing_bucket_is_one_line_naming_it_and_the_instance_finishes_once_it_exists(
    database: Database,
    database_url: str,
    processes: ProcessPool,
    s3: S3Server,
    store_env: dict[str, str],
) -> None:
    bucket = f"kenning-missing-{uuid.uuid4().hex[:8]}"
    expect_log("worker.object_store_unavailable")
    expect_log("instance.object_store_unavailable")
    await _worker(processes, database_url, {**store_env, "KENNING_OBJECT_STORE": f"s3://{bucket}/kenning"})
    async with Client(database=database) as client:
        started = await client.start("large_values", size=300_000, seed="late")
        log = processes.procs[-1][1]
        line = await eventually(
            lambda: next(
                (json.loads(x) for x in log.read_text().splitlines() if '"instance.object_store_unavailable"' in x),
                None,
            ),
            timeout=60,
            message="the store's error logged",
        )
        assert f"bucket {bucket!r} does not exist" in line["error"] and "KENNING_OBJECT_STORE" in line["error"]
        assert "\n" not in line["error"] and "Traceback" not in log.read_text()
        status = await client.status(started.instance_id)
        assert status.status not in ("failed", "compensating", "cancelled")  # nothing lost: it waits
        s3.client().create_bucket(Bucket=bucket)  # the operator fixes it
        result = await client.result(started.instance_id, timeout=120)
    assert result["text"] == blob(300_000, "late")


async def test_the_cli_reads_a_large_result_and_names_an_unreadable_object_in_one_line(
    database: Database,
    database_url: str,
    processes: ProcessPool,
    sql: Sql,
    s3: S3Server,
    store_env: dict[str, str],
) -> None:
    await _worker(processes, database_url, store_env)
    env = {"PATH": "/usr/bin:/bin", "KENNING_DATABASE_URL": database_url, **s3.env}  # a reader: no KENNING_OBJECT_STORE
    size = 200_000
    started = run_kenning(
        ["start", "large_values", "--input", json.dumps({"size": size, "seed": "cli"}), "--wait", "120", "--json"],
        env,
        timeout=150,
    )
    assert started.returncode == 0, started.stderr
    outcome = json.loads(started.stdout)
    assert outcome["result"]["text"] == blob(size, "cli")
    instance_id = outcome["instance_id"]
    (stored,) = _row_json(sql, "SELECT result FROM kenning_instances WHERE id = %s", instance_id)
    assert isinstance(stored, dict)
    key = stored["result"]["$ref"].removeprefix(f"s3://{s3.bucket}/")
    s3.client().delete_object(Bucket=s3.bucket, Key=key)  # lost outside Kenning
    async with Client(database=database) as client:
        with pytest.raises(ObjectStoreError) as raised:
            await client.result(instance_id, timeout=5)
    assert "the object is missing" in str(raised.value) and key in str(raised.value)
    again = run_kenning(["start", "large_values", "--instance-id", instance_id, "--wait", "5"], env)
    assert again.returncode == 2
    (line,) = again.stderr.strip().splitlines()
    assert "the object is missing" in line and key in line, line


async def test_the_scheduler_sweeps_orphans_and_retention_deletes_an_instances_objects(
    database: Database,
    database_url: str,
    processes: ProcessPool,
    sql: Sql,
    s3: S3Server,
    store_env: dict[str, str],
) -> None:
    await _worker(processes, database_url, store_env)
    async with Client(database=database) as client:
        started = await client.start("large_values", size=300_000, seed="kept")
        await client.result(started.instance_id, timeout=120)
    instance_id = started.instance_id
    referenced = s3.object_keys(f"kenning/{instance_id}/")
    assert len(referenced) == 2
    # what a failed commit leaves: an object of the instance no row names, one of an
    # instance whose start never committed
    orphans = [f"kenning/{instance_id}/{'0' * 64}", f"kenning/never-started/{'1' * 64}"]
    for key in orphans:
        s3.client().put_object(Bucket=s3.bucket, Key=key, Body=b'"lost"')
    scheduler_env = {
        **store_env,
        "KENNING_OBJECT_SWEEP_GRACE": "1",
        "KENNING_OBJECT_SWEEP_INTERVAL": "0.5",
        "KENNING_RETENTION_INTERVAL": "0.5",
    }
    scheduler = spawn_scheduler(processes, database_url, env=scheduler_env)
    await eventually(
        lambda: not any(key in s3.object_keys() for key in orphans), timeout=60, message="the orphans swept"
    )
    assert s3.object_keys(f"kenning/{instance_id}/") == referenced  # what rows reference stays
    assert '"objects.swept"' in processes.log_of(scheduler)
    async with Client(database=database) as client:  # and is still read back
        assert (await client.result(instance_id, timeout=5))["text"] == blob(300_000, "kept")

    # retention: the instance expires, its objects with it
    sql.execute("UPDATE kenning_workflow_definitions SET retention_seconds = 60 WHERE workflow_name = 'large_values'")
    sql.execute("UPDATE kenning_instances SET finished_at = now() - interval '1 day' WHERE id = %s", (instance_id,))
    await eventually(lambda: s3.object_keys(f"kenning/{instance_id}/") == [], timeout=60, message="its objects deleted")
    assert not _row_json(sql, "SELECT id FROM kenning_instances WHERE id = %s", instance_id)
    assert '"retention.objects_deleted"' in processes.log_of(scheduler)


async def test_the_console_previews_a_stored_value_and_streams_its_download(
    database: Database,
    database_url: str,
    processes: ProcessPool,
    sql: Sql,
    s3: S3Server,
    store_env: dict[str, str],
) -> None:
    await _worker(processes, database_url, store_env)
    url, console = spawn_console(processes, database_url, env=s3.env)
    size = 2 * 1024 * 1024
    async with Client(database=database) as client:
        started = await client.start("large_values", size=size, seed="shown")
        result = await client.result(started.instance_id, timeout=120)
    await console_ready(url, console)
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        page = await http.get(f"/instances/{started.instance_id}")
        assert page.status_code == 200
        assert blob(200, "shown") in page.text  # the preview: the value's first bytes, read from the store
        assert blob(20_000, "shown") not in page.text  # and no more
        download = await http.get(f"/values/{started.instance_id}", params={"of": "result"})
        assert download.status_code == 200
        assert json.loads(download.content) == {"result": result}
        assert int(download.headers["content-length"]) == len(download.content)
        # an object lost outside Kenning: one line, no traceback
        expect_log("console.http_error", status=502)
        (stored,) = _row_json(sql, "SELECT result FROM kenning_instances WHERE id = %s", started.instance_id)
        assert isinstance(stored, dict)
        s3.client().delete_object(Bucket=s3.bucket, Key=stored["result"]["$ref"].removeprefix(f"s3://{s3.bucket}/"))
        lost = await http.get(f"/values/{started.instance_id}", params={"of": "result"})
        assert lost.status_code == 502 and "the object is missing" in lost.text
        assert "cannot be read" in (await http.get(f"/instances/{started.instance_id}")).text


async def test_a_parent_reads_its_childs_large_result_through_the_reference(
    database: Database, database_url: str, processes: ProcessPool, s3: S3Server, store_env: dict[str, str]
) -> None:
    await _worker(processes, database_url, store_env)
    size = 400_000
    async with Client(database=database) as client:
        started = await client.start("large_child_result", size=size, seed="child")
        result = await client.result(started.instance_id, timeout=120)
    assert result == hashlib.sha256(blob(size, "child").encode()).hexdigest()


async def test_an_unreadable_object_at_replay_is_one_line_and_the_instance_waits_for_it(
    database: Database,
    database_url: str,
    processes: ProcessPool,
    sql: Sql,
    s3: S3Server,
    store_env: dict[str, str],
) -> None:
    expect_log("instance.object_store_unavailable")
    await _worker(processes, database_url, store_env)
    size = 300_000
    async with Client(database=database) as client:
        started = await client.start("large_then_receive", size=size, seed="gone")
        instance_id = started.instance_id
        await eventually(
            lambda: (
                _row_json(sql, "SELECT status FROM kenning_instances WHERE id = %s", instance_id)
                == ["waiting_for_message"]
            ),
            timeout=60,
            message="waiting for its message",
        )
        (payload,) = _row_json(sql, "SELECT payload FROM kenning_history WHERE instance_id = %s", instance_id)
        assert isinstance(payload, dict)
        key = payload["result"]["$ref"].removeprefix(f"s3://{s3.bucket}/")
        body = s3.client().get_object(Bucket=s3.bucket, Key=key)["Body"].read()
        s3.client().delete_object(Bucket=s3.bucket, Key=key)  # lost outside Kenning
        await client.send_message(instance_id, "go")
        log = processes.procs[-1][1]
        line = await eventually(
            lambda: next(
                (json.loads(x) for x in log.read_text().splitlines() if '"instance.object_store_unavailable"' in x),
                None,
            ),
            timeout=60,
            message="the unreadable object logged",
        )
        assert "the object is missing" in line["error"] and key in line["error"] and line["instance_id"] == instance_id
        # nothing lost: the instance is neither failed nor compensated; it waits for the store
        assert (await client.status(instance_id)).status in ("pending", "running")
        s3.client().put_object(Bucket=s3.bucket, Key=key, Body=body)  # restored from a backup
        result = await client.result(instance_id, timeout=120)
    assert result == hashlib.sha256(blob(size, "gone").encode()).hexdigest()
