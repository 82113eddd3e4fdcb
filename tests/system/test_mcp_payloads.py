"""``kenning mcp`` on sealed and offloaded values (issue 36): a real ``kenning mcp`` process,
spoken to with the ``mcp`` client library over stdio, shows an instance's result, history
and published values opened with the key, ``"encrypted"`` without it, an offloaded value
as a bounded preview read from a real S3 server (SeaweedFS), and a wrong key as a one-line
tool error."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.types import TextContent

from kenning import Client, WorkflowFailedError, codecs
from kenning.db import Database
from kenning.objects import payloads
from tests.apps import core, offload, published
from tests.apps.offload import blob
from tests.logguard import LogGuard, expect_log
from tests.objects_support import S3Server, seaweedfs
from tests.support import REPO_ROOT, running_worker
from tests.system.test_mcp import CLIENT, refused

KEY = "k1:" + base64.b64encode(b"\x01" * 32).decode()
WRONG = "k1:" + base64.b64encode(b"\x03" * 32).decode()
THRESHOLD = 64 * 1024
LARGE = 300_000  # offloaded: above the threshold
MEDIUM = 5_000  # in its row, above the 4 KiB a tool shows whole
Sql = psycopg.Connection[tuple[object, ...]]


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with seaweedfs(tmp_path_factory.mktemp("s3")) as server:
        yield server


@pytest.fixture(autouse=True)
def fresh_settings() -> Iterator[None]:
    payloads.reset()
    codecs.reset()
    yield
    payloads.reset()
    codecs.reset()


@contextlib.asynccontextmanager
async def session_with(database_url: str, log: Path, env: dict[str, str]) -> AsyncIterator[ClientSession]:
    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "kenning", "mcp", "--no-migrate"],
        env={"PYTHONPATH": str(REPO_ROOT), "KENNING_DATABASE_URL": database_url, "KENNING_LOG_FORMAT": "json", **env},
        cwd=REPO_ROOT,
    )
    with log.open("a") as errlog:
        async with (
            stdio_client(server, errlog=errlog) as (read, write),
            ClientSession(read, write, client_info=CLIENT) as session,
        ):
            await session.initialize()
            yield session


async def shown(session: ClientSession, instance_id: str) -> tuple[dict[str, Any], str]:
    raw = await session.call_tool("show_instance", {"instance_id": instance_id})
    (content,) = raw.content
    assert isinstance(content, TextContent) and not raw.is_error, content
    assert len(content.text.encode()) < 64_000
    return json.loads(content.text), content.text


def result_of(answer: dict[str, Any]) -> Any:
    instance = answer["instance"]
    return instance["result"] if instance["result"] is not None else instance["result_preview"]


def answer_value(answer: dict[str, Any]) -> dict[str, Any]:
    (value,) = [v for v in answer["published_values"] if v["key"] == "answer"]
    return dict(value)


async def test_values_opened_with_the_key_encrypted_without_it_offloaded_ones_previewed(
    database: Database,
    database_url: str,
    sql: Sql,
    s3: S3Server,
    tmp_path: Path,
    log_guard: LogGuard,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = {**s3.env, "KENNING_OBJECT_STORE": s3.url(), "KENNING_OFFLOAD_BYTES": str(THRESHOLD)}
    for name, value in store.items():
        monkeypatch.setenv(name, value)
    expect_log("instance.failed", workflow="saga")
    ids: dict[str, str] = {}
    worker_store: dict[str, Any] = {"object_store": s3.url(), "offload_bytes": THRESHOLD}
    async with Client(database=database) as client:
        async with running_worker(database, offload.app, **worker_store):  # no keys: plain, the large result offloaded
            plain = await client.start(offload.large_values, size=LARGE, seed="plain")
            assert (await client.result(plain.instance_id, timeout=60))["text"] == blob(LARGE, "plain")
        monkeypatch.setenv(codecs.KEYS_VARIABLE, KEY)
        codecs.reset()
        async with running_worker(database, offload.app, **worker_store):
            for name, size in (("large", LARGE), ("medium", MEDIUM), ("small", 10)):
                started = await client.start(offload.large_values, size=size, seed=name)
                assert (await client.result(started.instance_id, timeout=60))["text"] == blob(size, name)
                ids[name] = started.instance_id
        async with running_worker(database, core.app, **worker_store):  # a sealed error message
            failed = await client.start(core.saga, amount=1, fail=True)
            with pytest.raises(WorkflowFailedError):
                await client.result(failed.instance_id, timeout=60)
            ids["failed"] = failed.instance_id
        async with running_worker(database, published.app, **worker_store):  # a sealed published value, offloaded
            waiting = await client.start(published.publishes_later)
            ids["published"] = waiting.instance_id
            await client.send_message(waiting.instance_id, "go", {"blob": blob(LARGE, "published")})
            assert await client.get_value(waiting.instance_id, "answer", timeout=60) == {
                "blob": blob(LARGE, "published")
            }
    stored = sql.execute("SELECT result FROM kenning_instances WHERE id = %s", (ids["small"],)).fetchone()
    assert stored is not None and '"$enc"' in json.dumps(stored[0])  # sealed in the row

    log = tmp_path / "mcp.log"
    log_guard.watch_file("kenning mcp", log)
    async with session_with(database_url, log, {**store, codecs.KEYS_VARIABLE: KEY}) as session:
        answer, _ = await shown(session, plain.instance_id)  # plain, offloaded: its first bytes
        reference = result_of(answer)["result"]
        assert reference["size"] > LARGE and reference["preview"].startswith('{"text":"' + blob(100, "plain"))
        assert len(reference["preview"]) <= 1024
        for name in ("large", "medium"):
            answer, text = await shown(session, ids[name])
            assert '"$enc"' not in text, name
            assert blob(200, name) in json.dumps(result_of(answer)), name  # opened, its start shown
            assert blob(LARGE if name == "large" else MEDIUM, name) not in text  # never whole
        answer, text = await shown(session, ids["small"])
        assert answer["instance"]["result"] == {"result": {"text": blob(10, "small"), "digest": offload_digest()}}
        steps = [h for h in answer["history"] if h["kind"] == "ActivityCompleted"]
        assert steps and all('"$enc"' not in json.dumps(h) for h in steps)
        assert blob(10, "small") in json.dumps(steps)
        answer, text = await shown(session, ids["published"])
        assert blob(200, "published") in json.dumps(answer_value(answer)) and '"$enc"' not in text
        answer, text = await shown(session, ids["failed"])  # the error, in why's lines too
        assert '"$enc"' not in text and "'$enc'" not in text
        assert answer["instance"]["error_message"] == "no courier"
        assert any(line.endswith(": no courier") for line in answer["why"]["lines"]), answer["why"]

    async with session_with(database_url, log, store) as session:  # no key: "encrypted"
        for name in ("large", "medium", "small", "published", "failed"):
            answer, text = await shown(session, ids[name])
            assert '"$enc"' not in text and "'$enc'" not in text and codecs.ENCRYPTED in text, name
            assert blob(200, name) not in text
        answer, _ = await shown(session, ids["small"])
        assert answer["instance"]["result"] == {"result": codecs.ENCRYPTED}
        answer, _ = await shown(session, plain.instance_id)  # a plain value needs no key
        assert result_of(answer)["result"]["preview"].startswith('{"text":"' + blob(100, "plain"))

    async with session_with(database_url, log, {**store, codecs.KEYS_VARIABLE: WRONG}) as session:
        for name in ("large", "medium", "small", "published"):
            message = await refused(session, "show_instance", instance_id=ids[name])
            assert "key" in message, message


def offload_digest() -> str:
    return hashlib.sha256(blob(10, "small").encode()).hexdigest()
