"""The ingress over real HTTP: a ``kenning ingress`` process on a free port, the official
``cloudevents`` SDK as the client, the inbox checked in SQL."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import psycopg
import pytest

from kenning import Client
from tests.ingress_support import (
    BATCH_CONTENT_TYPE,
    Ingress,
    TcpProxy,
    batch,
    binary,
    cloned_database,
    cloud_event,
    inbox_count,
    new_id,
    start_ingress,
    structured,
    wait_until_serving,
)
from tests.support import ProcessPool, eventually, free_port

Sql = psycopg.Connection[tuple[object, ...]]
INGRESS_TOKEN = "in-token-7"
ADMIN_TOKEN = "admin-token-9"
MAX_BODY = 4096


@pytest.fixture(scope="module")
def module_database(pg_server_url: str, template_database: str) -> Iterator[str]:
    with cloned_database(pg_server_url, template_database) as url:
        yield url


@pytest.fixture(scope="module")
def ingress(module_database: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ingress]:
    pool = ProcessPool(str(tmp_path_factory.mktemp("ingress")))
    try:
        yield start_ingress(
            pool,
            module_database,
            "--max-body-bytes",
            str(MAX_BODY),
            env={"KENNING_ADMIN_TOKEN": ADMIN_TOKEN},
            token=INGRESS_TOKEN,
        )
    finally:
        pool.stop_all()


@pytest.fixture(scope="module")
def db(module_database: str) -> Iterator[Sql]:
    with psycopg.connect(module_database, autocommit=True) as conn:
        yield conn


@pytest.fixture
async def http(ingress: Ingress) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=ingress.url, headers=ingress.headers(), timeout=10) as client:
        yield client


def row_of(db: Sql, source: str, event_id: str) -> dict[str, Any]:
    cursor = db.execute(
        "SELECT kind, event_type, instance_id, attributes, data, data_bytes, status, attempts "
        "FROM kenning_inbox WHERE source = %s AND event_id = %s",
        (source, event_id),
    )
    rows = cursor.fetchall()
    assert len(rows) == 1, rows
    names = [d.name for d in cursor.description or []]
    return dict(zip(names, rows[0], strict=True))


# ------------------------------------------------------------------ the three content modes


async def test_binary_mode_stores_json_data_as_jsonb_and_other_data_as_bytes(http: httpx.AsyncClient, db: Sql) -> None:
    source = f"/orders/{new_id()}"
    event = cloud_event(
        "order.placed", {"order_id": "o-1", "items": [1, 2], "note": "crème"}, source=source, subject="o/1 é%"
    )
    headers, body = binary(event)
    response = await http.post("/anything/at/all", headers=headers, content=body)
    assert response.status_code == 202
    assert response.json() == {"status": "accepted", "source": source, "id": event.get_id(), "duplicate": False}
    row = row_of(db, source, event.get_id())
    assert row["data"] == {"order_id": "o-1", "items": [1, 2], "note": "crème"} and row["data_bytes"] is None
    assert row["attributes"]["subject"] == "o/1 é%"  # percent-decoded
    assert row["attributes"]["time"] == headers["ce-time"]
    assert (row["kind"], row["status"], row["attempts"], row["event_type"]) == ("event", "pending", 0, "order.placed")

    blob = bytes(range(256))
    octets = cloud_event("file.uploaded", blob, source=source, datacontenttype="application/octet-stream")
    response = await http.post("/", headers=binary(octets)[0], content=binary(octets)[1])
    assert response.status_code == 202
    row = row_of(db, source, octets.get_id())
    assert bytes(row["data_bytes"]) == blob and row["data"] is None
    assert row["attributes"]["datacontenttype"] == "application/octet-stream"

    words = cloud_event("note.written", "hello\nwörld", source=source, datacontenttype="text/plain; charset=utf-8")
    response = await http.post("/", headers=binary(words)[0], content=binary(words)[1])
    assert response.status_code == 202
    assert row_of(db, source, words.get_id())["data"] == "hello\nwörld"


async def test_structured_mode_with_json_data_and_data_base64(http: httpx.AsyncClient, db: Sql) -> None:
    source = f"/s/{new_id()}"
    event = cloud_event("user.created", {"email": "a@b.c", "n": 1.5}, source=source, kenninginstanceid="inst-1")
    headers, body = structured(event)
    assert headers["content-type"] == "application/cloudevents+json"
    response = await http.post("/", headers=headers, content=body)
    assert response.status_code == 202 and response.json()["duplicate"] is False
    row = row_of(db, source, event.get_id())
    assert row["data"] == {"email": "a@b.c", "n": 1.5} and row["instance_id"] == "inst-1"
    assert row["attributes"]["kenninginstanceid"] == "inst-1"

    octets = cloud_event("blob", b"\x00\x01\xfe\xff", source=source)
    headers, body = structured(octets)
    assert b"data_base64" in body
    response = await http.post(
        "/", headers={**headers, "content-type": headers["content-type"] + "; charset=utf-8"}, content=body
    )
    assert response.status_code == 202
    row = row_of(db, source, octets.get_id())
    assert bytes(row["data_bytes"]) == b"\x00\x01\xfe\xff" and row["data"] is None


async def test_a_batch_is_stored_whole_or_not_at_all(http: httpx.AsyncClient, db: Sql) -> None:
    source = f"/b/{new_id()}"
    events = [cloud_event("batch.item", {"n": n}, source=source) for n in range(3)]
    events.append(cloud_event("batch.blob", b"\xff\x00", source=source))
    headers, body = batch(events)
    response = await http.post("/", headers=headers, content=body)
    assert response.status_code == 202
    assert response.json() == {
        "status": "accepted",
        "accepted": 4,
        "duplicates": 0,
        "events": [{"source": source, "id": e.get_id(), "duplicate": False} for e in events],
    }
    assert [row_of(db, source, e.get_id())["data"] for e in events[:3]] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert bytes(row_of(db, source, events[3].get_id())["data_bytes"]) == b"\xff\x00"

    before = inbox_count(db)
    good = cloud_event("batch.item", {"n": 9}, source=source)
    bad = json.loads(structured(cloud_event("batch.item", None, source=source))[1])
    del bad["type"]
    body = json.dumps([json.loads(structured(good)[1]), bad]).encode()
    response = await http.post("/", headers={"content-type": BATCH_CONTENT_TYPE}, content=body)
    assert response.status_code == 400
    assert response.json()["error_type"] == "missing_attribute"
    assert response.json()["error"].startswith("event 1 of the batch")
    assert inbox_count(db) == before  # the good event was not stored either

    response = await http.post("/", headers={"content-type": BATCH_CONTENT_TYPE}, content=b"[]")
    assert response.status_code == 202 and response.json()["accepted"] == 0


async def test_duplicates_by_source_and_id_are_accepted_and_stored_once(http: httpx.AsyncClient, db: Sql) -> None:
    source = f"/d/{new_id()}"
    event = cloud_event("dup.test", {"v": 1}, source=source, id="same-id")
    headers, body = binary(event)
    first = await http.post("/", headers=headers, content=body)
    again = await http.post("/", headers=structured(event)[0], content=structured(event)[1])
    assert (first.status_code, again.status_code) == (202, 202)
    assert (first.json()["duplicate"], again.json()["duplicate"]) == (False, True)
    other_source = cloud_event("dup.test", {"v": 2}, source=source + "/other", id="same-id")
    assert (await http.post("/", headers=binary(other_source)[0], content=binary(other_source)[1])).json()[
        "duplicate"
    ] is False
    in_batch = cloud_event("dup.test", {"v": 3}, source=source, id="batch-id")
    response = await http.post("/", headers=batch([in_batch, in_batch])[0], content=batch([in_batch, in_batch])[1])
    assert response.json()["duplicates"] == 1
    rows = db.execute("SELECT source, event_id FROM kenning_inbox WHERE source LIKE %s ORDER BY id", (source + "%",))
    assert rows.fetchall() == [(source, "same-id"), (source + "/other", "same-id"), (source, "batch-id")]
    assert row_of(db, source, "same-id")["data"] == {"v": 1}  # the first copy wins


# ------------------------------------------------------------------ every 400


def _binary_without(header: str, **attributes: Any) -> tuple[dict[str, str], bytes]:
    headers, body = binary(cloud_event("t.bad", {"a": 1}, **attributes))
    return {k: v for k, v in headers.items() if k != header}, body


def _structured_with(**changes: Any) -> tuple[dict[str, str], bytes]:
    document = json.loads(structured(cloud_event("t.bad", {"a": 1}))[1])
    document.update(changes)
    for key in [k for k, v in changes.items() if v is _DROP]:
        del document[key]
    return {"content-type": "application/cloudevents+json"}, json.dumps(document).encode()


_DROP = object()


def _binary_header(name: str, value: str | bytes) -> tuple[dict[str, Any], bytes]:
    headers, body = binary(cloud_event("t.bad", {"a": 1}))
    return {**headers, name: value}, body


INVALID: dict[str, tuple[tuple[dict[str, Any], bytes], str]] = {
    "binary without id": (_binary_without("ce-id"), "missing_attribute"),
    "binary without specversion": (_binary_without("ce-specversion"), "missing_attribute"),
    "structured without source": (_structured_with(source=_DROP), "missing_attribute"),
    "structured without type": (_structured_with(type=_DROP), "missing_attribute"),
    "structured empty id": (_structured_with(id=""), "invalid_attribute"),
    "specversion 0.3": (_structured_with(specversion="0.3"), "unsupported_specversion"),
    "specversion 2.0 in binary": (_binary_header("ce-specversion", "2.0"), "unsupported_specversion"),
    "structured body not JSON": (
        ({"content-type": "application/cloudevents+json"}, b'{"specversion": '),
        "invalid_json",
    ),
    "structured body not an object": (({"content-type": "application/cloudevents+json"}, b"[1]"), "invalid_json"),
    "binary JSON data not JSON": (
        ({**binary(cloud_event("t.bad", {"a": 1}))[0], "content-type": "application/json"}, b"{nope"),
        "invalid_json",
    ),
    "NaN in JSON data": (
        ({**binary(cloud_event("t.bad", {"a": 1}))[0], "content-type": "application/json"}, b'{"a": NaN}'),
        "invalid_json",
    ),
    "number out of range": (
        (
            {"content-type": "application/cloudevents+json"},
            _structured_with(data={"a": 1})[1].replace(b"1}", b"1e400}"),
        ),
        "invalid_data",
    ),
    "batch not an array": (({"content-type": BATCH_CONTENT_TYPE}, b'{"a": 1}'), "invalid_batch"),
    "batch element not an object": (({"content-type": BATCH_CONTENT_TYPE}, b"[1]"), "invalid_batch"),
    "text/plain without ce- headers": (({"content-type": "text/plain"}, b"hello"), "unsupported_content_type"),
    "no content type, no ce- headers": (({}, b'{"a": 1}'), "unsupported_content_type"),
    "cloudevents+xml": (({"content-type": "application/cloudevents+xml"}, b"<e/>"), "unsupported_content_type"),
    "batch of xml": (({"content-type": "application/cloudevents-batch+xml"}, b"<e/>"), "unsupported_content_type"),
    "NUL in text data": (
        ({**binary(cloud_event("t.bad", {"a": 1}))[0], "content-type": "text/plain"}, b"a\x00b"),
        "invalid_data",
    ),
    "\\u0000 in JSON data": (_structured_with(data={"a": "x\u0000y"}), "invalid_data"),
    "\\u0000 in a JSON key": (_structured_with(data={"k\u0000": 1}), "invalid_data"),
    "NUL in a structured attribute": (_structured_with(subject="a\u0000"), "invalid_data"),
    "lone surrogate in JSON data": (
        ({"content-type": "application/cloudevents+json"}, _structured_with(data="X")[1].replace(b'"X"', b'"\\ud800"')),
        "invalid_data",
    ),
    "percent-encoded NUL in a header": (_binary_header("ce-subject", "a%00b"), "invalid_data"),
    "bad percent-encoding": (_binary_header("ce-subject", "100%ZZ"), "invalid_encoding"),
    "overlong UTF-8 %C0%A0": (_binary_header("ce-subject", "%C0%A0"), "invalid_encoding"),
    "invalid UTF-8 %FF": (_binary_header("ce-source", "%FFsource"), "invalid_encoding"),
    "raw non-ASCII header byte": (_binary_header("ce-subject", "caf\xe9".encode("latin-1")), "invalid_encoding"),
    "structured body not UTF-8": (
        ({"content-type": "application/cloudevents+json"}, _structured_with(subject="X")[1].replace(b'"X"', b'"\xff"')),
        "invalid_encoding",
    ),
    "time not a timestamp": (_structured_with(time="yesterday"), "invalid_attribute"),
    "time without offset": (_structured_with(time="2026-01-01T10:00:00"), "invalid_attribute"),
    "extension name with capitals": (_structured_with(BadName="x"), "invalid_attribute"),
    "extension value an object": (_structured_with(myext={"a": 1}), "invalid_attribute"),
    "data and data_base64": (_structured_with(data_base64="AAE="), "invalid_data"),
    "invalid base64": (_structured_with(data=_DROP, data_base64="***"), "invalid_data"),
    "ce-data header": (_binary_header("ce-data", "x"), "invalid_attribute"),
    # Kenning's own event types and sources (a child's end, kenning/children.py) cannot be
    # faked, nor a child's (source, id) taken first so that its real end is dropped
    "reserved kenning.* type": (
        binary(cloud_event("kenning.child.finished", {"child_id": "c"})),
        "reserved_attribute",
    ),
    "reserved kenning.* source": (
        binary(cloud_event("order.placed", {"child_id": "c"}, source="kenning.children")),
        "reserved_attribute",
    ),
}


@pytest.mark.parametrize("case", list(INVALID))
async def test_invalid_requests_get_400_and_store_nothing(http: httpx.AsyncClient, db: Sql, case: str) -> None:
    (headers, body), error_type = INVALID[case]
    before = inbox_count(db)
    response = await http.post("/events", headers=headers, content=body)
    assert response.status_code == 400, response.text
    answer = response.json()
    assert set(answer) == {"error", "error_type", "retryable"}
    assert (answer["error_type"], answer["retryable"]) == (error_type, False), answer
    assert answer["error"]
    assert inbox_count(db) == before


async def test_bodies_over_the_limit_get_413_and_store_nothing(http: httpx.AsyncClient, db: Sql) -> None:
    before = inbox_count(db)
    headers, _ = binary(cloud_event("big", None, datacontenttype="application/octet-stream"))
    response = await http.post("/", headers=headers, content=b"x" * (MAX_BODY + 1))
    assert response.status_code == 413
    assert response.json() == {
        "error": f"request body over {MAX_BODY} bytes",
        "error_type": "payload_too_large",
        "retryable": False,
    }

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted while reading
        for _ in range(MAX_BODY // 1000 + 1):
            yield b"y" * 1000

    response = await http.post("/", headers=headers, content=chunks())
    assert response.status_code == 413 and response.json()["error_type"] == "payload_too_large"
    assert inbox_count(db) == before
    response = await http.post("/", headers=headers, content=b"z" * MAX_BODY)  # exactly the limit
    assert response.status_code == 202
    assert inbox_count(db) == before + 1


# ------------------------------------------------------------------ access control and other routes


async def test_tokens_guard_events_and_the_admin_routes(ingress: Ingress) -> None:
    headers, body = binary(cloud_event("auth.test", {"a": 1}))
    async with httpx.AsyncClient(base_url=ingress.url, timeout=10) as anonymous:
        response = await anonymous.post("/", headers=headers, content=body)
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"
        assert response.json() == {
            "error": "missing or wrong bearer token",
            "error_type": "unauthorized",
            "retryable": False,
        }
        for token in ("wrong", ADMIN_TOKEN, INGRESS_TOKEN + "x"):
            response = await anonymous.post("/", headers=ingress.headers(headers, token=token), content=body)
            assert response.status_code == 401, token
        assert (await anonymous.post("/", headers=ingress.headers(headers), content=body)).status_code == 202
        # the event token cannot cancel or read instances; the admin token can
        for method, path in (("POST", "/cancel/x"), ("GET", "/instances/x")):
            assert (await anonymous.request(method, path)).status_code == 401
            assert (await anonymous.request(method, path, headers=ingress.headers())).status_code == 401
            response = await anonymous.request(method, path, headers=ingress.headers(token=ADMIN_TOKEN))
            assert response.status_code == 404
        assert (await anonymous.get("/healthz")).json() == {"status": "ok"}
        assert (await anonymous.get("/readyz")).json() == {"status": "ready"}


async def test_cancel_and_instance_routes(ingress: Ingress, module_database: str, db: Sql) -> None:
    admin = ingress.headers(token=ADMIN_TOKEN)
    async with httpx.AsyncClient(base_url=ingress.url, headers=admin, timeout=10) as http:
        response = await http.post("/cancel/no-such-instance")
        assert response.status_code == 404
        assert response.json() == {
            "error": "no workflow instance 'no-such-instance'",
            "error_type": "not_found",
            "retryable": False,
        }
        assert (await http.post("/cancel/")).json()["error_type"] == "invalid_request"
        async with Client(module_database) as client:
            started = await client.start("waits_any", instance_id=f"route/{new_id()}")
        response = await http.post(f"/cancel/{started.instance_id}")
        assert response.status_code == 202
        assert response.json() == {"status": "accepted", "instance_id": started.instance_id}
        rows = db.execute(
            "SELECT kind, event_type, instance_id, status FROM kenning_inbox "
            "WHERE kind = 'cancel' AND instance_id = %s",
            (started.instance_id,),
        ).fetchall()
        assert rows == [("cancel", "kenning.cancel", started.instance_id, "pending")]

        response = await http.get(f"/instances/{started.instance_id}")
        assert response.status_code == 200
        answer = response.json()
        assert (answer["instance_id"], answer["workflow"], answer["status"]) == (
            started.instance_id,
            "waits_any",
            "pending",
        )
        assert "result" not in answer and answer["finished_at"] is None
        db.execute(
            "UPDATE kenning_instances SET status = 'completed', result = '{\"result\": {\"ok\": [1]}}', "
            "finished_at = now() WHERE id = %s",
            (started.instance_id,),
        )
        answer = (await http.get(f"/instances/{started.instance_id}")).json()
        assert answer["status"] == "completed" and answer["result"] == {"ok": [1]} and answer["finished_at"]


async def test_reserved_paths_and_wrong_methods_answer_json(http: httpx.AsyncClient, db: Sql) -> None:
    before = inbox_count(db)
    headers, body = binary(cloud_event("reserved", {"a": 1}))
    for path in ("/healthz", "/readyz", "/instances/x"):
        response = await http.post(path, headers=headers, content=body)
        assert response.status_code == 405 and response.json()["error_type"] == "method_not_allowed", path
    response = await http.get("/some/event/path")
    assert response.status_code == 405
    assert response.json() == {"error": "Method Not Allowed", "error_type": "method_not_allowed", "retryable": False}
    assert inbox_count(db) == before


@pytest.mark.smoke
async def test_unreachable_database_gets_503_and_the_ingress_recovers(
    database_url: str, sql: Sql, processes: ProcessPool
) -> None:
    proxy = TcpProxy(database_url)
    await proxy.start()
    try:
        ingress = start_ingress(processes, proxy.url, "--database-timeout", "2")
        async with httpx.AsyncClient(base_url=ingress.url, timeout=15) as http:

            async def post(event_id: str) -> httpx.Response:
                headers, body = binary(cloud_event("outage.test", {"n": event_id}, id=event_id))
                return await http.post("/", headers=headers, content=body)

            assert (await post("before")).status_code == 202
            await proxy.stop()
            response = await post("during")
            assert response.status_code == 503
            answer = response.json()
            assert (answer["error_type"], answer["retryable"]) == ("database_unavailable", True)
            assert response.headers["retry-after"] == "1"
            ready = await http.get("/readyz")
            assert ready.status_code == 503 and ready.json()["retryable"] is True
            for said in (response.text, ready.text):  # what happened, not where the database is
                assert "127.0.0.1" not in said and str(proxy.port) not in said and "connection" not in said, said
            assert (await http.get("/healthz")).status_code == 200  # the process itself is up

            await proxy.start()  # the database is back: the next requests succeed
            accepted: list[httpx.Response] = []

            async def database_back() -> bool:
                response = await post("during")
                if response.status_code == 202:
                    accepted.append(response)
                return bool(accepted)

            back: bool = await eventually(database_back, timeout=15)
            assert back
            assert accepted[0].json()["duplicate"] is False
        rows = sql.execute("SELECT event_id FROM kenning_inbox ORDER BY id").fetchall()
        assert rows == [("before",), ("during",)]
    finally:
        await proxy.stop()
    assert "Traceback" not in processes.log_of(ingress.process)


def test_ingress_cli_reports_bad_configuration(processes: ProcessPool) -> None:
    bad_url = processes.spawn(["ingress", "--database-url", "mysql://x/y"], name="bad-url")
    bad_size = processes.spawn(
        ["ingress", "--database-url", "postgresql://localhost/x"],
        env={"KENNING_MAX_BODY_BYTES": "1MB"},
        name="bad-size",
    )
    assert bad_url.wait(timeout=30) == 2 and bad_size.wait(timeout=30) == 2
    assert "database URL must start with postgresql://" in processes.log_of(bad_url)
    assert "KENNING_MAX_BODY_BYTES='1MB' is invalid" in processes.log_of(bad_size)
    assert "Traceback" not in processes.log_of(bad_url) + processes.log_of(bad_size)


# ------------------------------------------------------------------ the ingress under attack


def _big_ints(value: int) -> tuple[dict[str, str], bytes]:
    return _structured_with(bigext=value)


LIMITS: dict[str, tuple[tuple[dict[str, Any], bytes], str]] = {
    "a 60 KB ce-type": (_binary_header("ce-type", "t" * 60_000), "attribute 'type' is over 4096 characters"),
    "2,000 extension headers": (
        ({**binary(cloud_event("t.many", {"a": 1}))[0], **{f"ce-x{n}": "1" for n in range(2000)}}, b"{}"),
        "over 64 extension attributes",
    ),
    "a 9,000-character id": (_binary_header("ce-id", "i" * 9000), "attribute 'id' is over 1024 characters"),
    "a 2,000-character source": (_binary_header("ce-source", "s" * 2000), "attribute 'source' is over 1024 characters"),
    "a 2,000-character instance id": (
        _binary_header("ce-kenninginstanceid", "k" * 2000),
        "attribute 'kenninginstanceid' is over 1024 characters",
    ),
    "a 21-character extension name": (_binary_header("ce-" + "e" * 21, "x"), "over 20 characters"),
    "an integer over 32 bits": (_big_ints(2**31), "a 32-bit integer"),
    "an integer under 32 bits": (_big_ints(-(2**31) - 1), "a 32-bit integer"),
}


@pytest.mark.parametrize("case", list(LIMITS))
async def test_attributes_over_the_limits_get_400_naming_the_limit(http: httpx.AsyncClient, db: Sql, case: str) -> None:
    (headers, body), says = LIMITS[case]
    before = inbox_count(db)
    response = await http.post("/", headers=headers, content=body)
    assert response.status_code == 400, response.text
    answer = response.json()
    assert (answer["error_type"], answer["retryable"]) == ("limit_exceeded", False), answer
    assert says in answer["error"], answer
    assert inbox_count(db) == before


async def test_attributes_at_the_limits_are_accepted(http: httpx.AsyncClient, db: Sql) -> None:
    extensions = {f"x{n}": str(n) for n in range(63)} | {"e" * 20: "twenty"}
    event = cloud_event("t" * 4096, {"a": 1}, id="i" * 1024, source="s" * 1024, **extensions)
    headers, body = binary(event)
    response = await http.post("/", headers=headers, content=body)
    assert response.status_code == 202, response.text
    assert row_of(db, "s" * 1024, "i" * 1024)["attributes"]["e" * 20] == "twenty"
    for value in (2**31 - 1, -(2**31)):  # CloudEvents integers are 32-bit, both ends included
        headers, body = _big_ints(value)
        response = await http.post("/", headers=headers, content=body)
        assert response.status_code == 202, response.text


UNSTORABLE_PATHS = ["/instances/%00", "/instances/a%00b", "/cancel/%00", "/instances/" + "x" * 9000]


async def test_ids_postgresql_cannot_hold_get_400_and_log_no_error(database_url: str, processes: ProcessPool) -> None:
    ingress = start_ingress(processes, database_url)
    async with httpx.AsyncClient(base_url=ingress.url, timeout=10) as http:
        for path in UNSTORABLE_PATHS:
            method = "POST" if path.startswith("/cancel") else "GET"
            response = await http.request(method, path)
            assert response.status_code == 400, (path, response.text)
            answer = response.json()
            assert (answer["error_type"], answer["retryable"]) == ("invalid_request", False), answer
            assert "instance id" in answer["error"]
        # a query string reaches no SQL, but a NUL in it must not hurt either
        assert (await http.get("/instances/nope?x=%00")).status_code == 404
    assert "Traceback" not in processes.log_of(ingress.process)


async def test_a_stored_database_error_is_shown_without_its_sql(
    ingress: Ingress, module_database: str, db: Sql
) -> None:
    async with Client(module_database) as client:
        started = await client.start("waits_any", instance_id=f"sqlerr/{new_id()}")
    leaked = (
        "(psycopg.errors.DataError) value too long for type character varying(10)\n"
        "[SQL: UPDATE kenning_instances SET status = %(status)s WHERE lease_token = %(token)s]\n"
        "[parameters: {'status': 'failed', 'token': 'lease-secret-42'}]\n"
        "(Background on this error at: https://sqlalche.me/e/20/9h9h)"
    )
    db.execute(
        "UPDATE kenning_instances SET status = 'failed', error = %s::jsonb, finished_at = now() WHERE id = %s",
        (json.dumps({"type": "DataError", "message": leaked}), started.instance_id),
    )
    async with httpx.AsyncClient(base_url=ingress.url, headers=ingress.headers(token=ADMIN_TOKEN)) as http:
        answer = (await http.get(f"/instances/{started.instance_id}")).json()
    assert answer["error"] == {
        "type": "DataError",
        "message": "(psycopg.errors.DataError) value too long for type character varying(10)",
    }


def _raw_exchange(url: str, request: bytes, *, timeout: float = 15.0) -> bytes:
    """Send raw bytes and read until the server closes the connection."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as conn:
        if request:
            conn.sendall(request)
        received = b""
        while chunk := conn.recv(65536):
            received += chunk
        return received


def _json_answer(raw: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    assert b"content-type: application/json" in head.lower(), head
    return status, json.loads(body)


async def test_malformed_http_oversized_headers_and_slow_clients_get_json(
    database_url: str, processes: ProcessPool
) -> None:
    ingress = start_ingress(
        processes, database_url, "--ingress-read-timeout", "1", "--ingress-max-header-bytes", "8192"
    )
    status, answer = _json_answer(_raw_exchange(ingress.url, b"THIS IS NOT HTTP\r\n\r\n"))
    assert (status, answer["error_type"], answer["retryable"]) == (400, "invalid_request", False), answer

    huge = b"POST / HTTP/1.1\r\nHost: x\r\n" + b"".join(b"ce-x%d: %s\r\n" % (n, b"v" * 100) for n in range(200))
    status, answer = _json_answer(_raw_exchange(ingress.url, huge))
    assert (status, answer["error_type"]) == (431, "limit_exceeded"), answer
    assert "8192" in answer["error"]

    # slowloris: a request whose headers never end, and one whose body never comes
    status, answer = _json_answer(_raw_exchange(ingress.url, b"POST / HTTP/1.1\r\nHost: x\r\nce-id: 1\r\n"))
    assert (status, answer["error_type"]) == (408, "request_timeout"), answer
    slow_body = (
        b"POST / HTTP/1.1\r\nHost: x\r\ncontent-type: application/cloudevents+json\r\ncontent-length: 100\r\n\r\n{"
    )
    status, answer = _json_answer(_raw_exchange(ingress.url, slow_body))
    assert (status, answer["error_type"]) == (408, "request_timeout"), answer
    assert _raw_exchange(ingress.url, b"") == b""  # a client that says nothing is cut, without an answer
    async with httpx.AsyncClient(base_url=ingress.url, timeout=10) as http:
        assert (await http.get("/healthz")).status_code == 200  # and the ingress serves on


def test_an_open_ingress_on_a_public_address_refuses_to_start(database_url: str, processes: ProcessPool) -> None:
    refused = processes.spawn(
        ["ingress", "--host", "0.0.0.0", "--port", str(free_port()), "--no-migrate"],
        env={"KENNING_DATABASE_URL": database_url, "KENNING_INGRESS_TOKEN": "", "KENNING_ADMIN_TOKEN": ""},
        name="open-refused",
    )
    assert refused.wait(timeout=30) == 2
    said = processes.log_of(refused)
    assert "refusing to listen on 0.0.0.0 without KENNING_INGRESS_TOKEN" in said and "Traceback" not in said

    port = free_port()
    opened = processes.spawn(
        ["ingress", "--host", "0.0.0.0", "--port", str(port), "--no-migrate"],
        env={"KENNING_DATABASE_URL": database_url, "KENNING_INGRESS_ALLOW_OPEN": "true"},
        name="open-allowed",
    )
    wait_until_serving(f"http://127.0.0.1:{port}", opened)
    warnings = [json.loads(line) for line in processes.log_of(opened).splitlines() if '"ingress.open"' in line]
    assert [(w["level"], w["host"]) for w in warnings] == [("warning", "0.0.0.0")]

    guarded = start_ingress(processes, database_url, "--host", "0.0.0.0", token="tok")
    assert '"ingress.open"' not in processes.log_of(guarded.process)
