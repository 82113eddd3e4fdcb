"""The console's actions and events pages: their SQL (kenning.storage.console_actions) and
the retry they share with ``kenning instances retry``, against real PostgreSQL."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import httpx
import psycopg

from kenning.db import Database
from kenning.storage import console_actions as console_sql
from kenning.storage.inbox import NewEvent, inbox_insert_events
from tests.console_support import (
    action_lines,
    became,
    console_ready,
    instance_status,
    own_origin,
    post_form,
    spawn_console,
)
from tests.logguard import expect_log
from tests.relayer_support import insert_events
from tests.support import ProcessPool, eventually, executions

APP = "tests.apps.console"

Sql = psycopg.Connection[tuple[object, ...]]


async def _events(database: Database, count: int, event_type: str = "thing.happened") -> list[int]:
    async with database.connection() as conn:
        stored = await inbox_insert_events(
            conn,
            [
                NewEvent(source="/t", event_id=f"{event_type}-{n}", event_type=event_type, data={"n": n})
                for n in range(count)
            ],
        )
    assert all(stored)
    async with database.connection() as conn:
        rows = await console_sql.inbox_page(conn, event_type=event_type, limit=count)
    return sorted(row.id for row in rows)


async def test_inbox_pages_by_keyset_newest_first_and_by_status(database: Database, sql: Sql) -> None:
    ids = await _events(database, 7)
    await _events(database, 2, "other.kind")
    sql.execute("UPDATE kenning_inbox SET status = 'failed', last_error = 'no handler: boom' WHERE id = %s", [ids[2]])
    sql.execute("UPDATE kenning_inbox SET status = 'processed', processed_at = now() WHERE id = %s", [ids[3]])
    async with database.connection() as conn:
        first = await console_sql.inbox_page(conn, event_type="thing.happened", limit=3)
        second = await console_sql.inbox_page(conn, event_type="thing.happened", before=first[-1].id, limit=3)
        third = await console_sql.inbox_page(conn, event_type="thing.happened", before=second[-1].id, limit=3)
        parked = await console_sql.inbox_page(conn, status="failed", limit=10)
        counts = await console_sql.inbox_counts(conn)
    assert [r.id for r in first + second + third] == sorted(ids, reverse=True)
    assert len(third) == 1
    assert [(r.id, r.last_error, r.data) for r in parked] == [(ids[2], "no handler: boom", {"n": 2})]
    assert counts == {"pending": 7, "processed": 1, "failed": 1}


async def test_a_parked_inbox_row_retried_is_due_now_with_fresh_attempts(database: Database, sql: Sql) -> None:
    ids = await _events(database, 2)
    sql.execute(
        "UPDATE kenning_inbox SET status = 'failed', attempts = 5, processed_at = now(), "
        "available_at = now() + interval '1 hour', last_error = 'boom' WHERE id = %s",
        [ids[0]],
    )
    async with database.connection() as conn:
        retried = await console_sql.inbox_retry_parked(conn, ids)  # the second is not parked: left alone
        again = await console_sql.inbox_retry_parked(conn, ids)
    assert (retried, again) == ([ids[0]], [])
    row = sql.execute(
        "SELECT status, attempts, processed_at, available_at <= now() AS due, last_error FROM kenning_inbox "
        "WHERE id = %s",
        [ids[0]],
    ).fetchone()
    assert row == ("pending", 0, None, True, "boom")


async def test_outbox_pages_by_keyset_and_counts_dead_letters(database: Database, sql: Sql) -> None:
    ids = await insert_events(database, 5)
    sql.execute(
        "UPDATE kenning_outbox SET status = 'failed', last_error = '503 from the broker: try later' WHERE id = %s",
        [ids[1]],
    )
    async with database.connection() as conn:
        first = await console_sql.outbox_page(conn, limit=2)
        rest = await console_sql.outbox_page(conn, before=first[-1].created_seq, limit=10)
        dead = await console_sql.outbox_page(conn, status="failed", limit=10)
        counts = await console_sql.outbox_counts(conn)
    assert [r.id for r in first + rest] == list(reversed(ids))
    assert [(r.id, r.last_error) for r in dead] == [(ids[1], "503 from the broker: try later")]
    assert counts == {"pending": 4, "publishing": 0, "published": 0, "failed": 1}


# ------------------------------------------------------------------ the actions, on a real console


async def _start(client: httpx.AsyncClient, workflow: str, arguments: dict[str, object]) -> str:
    """Start through the form's two steps; returns the instance id."""
    fields = {"workflow": workflow, "input": json.dumps(arguments), "instance_id": "", "idempotency_key": ""}
    review = await post_form(client, "/start", {**fields, "step": "review"})
    assert review.status_code == 200, review.text
    instance_id = re.search(r'name="instance_id" value="([^"]+)"', review.text)
    assert instance_id is not None
    started = await post_form(client, "/start", {**fields, "instance_id": instance_id[1], "step": "confirm"})
    assert started.status_code == 303 and started.headers["location"] == f"/instances/{instance_id[1]}"
    return instance_id[1]


async def test_retry_reruns_a_failed_instance_from_its_history_with_fresh_attempts(
    processes: ProcessPool, database_url: str, sql: Sql, side_channel: str, blocker: Path
) -> None:
    expect_log("instance.failed", workflow="shop.fulfil")
    blocker.touch()
    url, console = spawn_console(processes, database_url, app=APP)
    processes.worker(database_url, APP)
    await console_ready(url, console)
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        instance_id = await _start(client, "shop.fulfil", {"order_id": "o-7"})
        await became(sql, instance_id, "failed")
        assert executions(side_channel) == {f"prepare {instance_id}": 1, f"deliver {instance_id}": 2}

        page = await client.get(f"/instances/{instance_id}/retry")
        assert page.status_code == 200 and "recorded history" in page.text
        forged = await client.post(
            f"/instances/{instance_id}/retry", data={"csrf_token": "forged"}, headers={"origin": own_origin(client)}
        )
        assert forged.status_code == 403 and instance_status(sql, instance_id) == "failed"

        # still blocked: deliver gets its 2 attempts again (reset), prepare is replayed, not run
        assert (await post_form(client, f"/instances/{instance_id}/retry", {})).status_code == 303
        await eventually(lambda: executions(side_channel)[f"deliver {instance_id}"] == 4, timeout=20)
        await became(sql, instance_id, "failed")
        blocker.unlink()
        assert (await post_form(client, f"/instances/{instance_id}/retry", {})).status_code == 303
        await became(sql, instance_id, "completed")
        assert executions(side_channel) == {f"prepare {instance_id}": 1, f"deliver {instance_id}": 5}
        result = sql.execute("SELECT result FROM kenning_instances WHERE id = %s", [instance_id]).fetchone()
        assert result == ({"result": "prepared o-7, delivered o-7"},)

        refused = await post_form(client, f"/instances/{instance_id}/retry", {})
        assert refused.status_code == 409 and "only a failed instance can be retried" in refused.text
    logged = action_lines(processes.log_of(console), "retry")
    assert [(line["instance_id"], line["retried"]) for line in logged] == [
        (instance_id, True),
        (instance_id, True),
        (instance_id, False),
    ]


async def test_the_start_form_checks_the_input_against_the_signature_and_asks_first(
    processes: ProcessPool, database_url: str, sql: Sql
) -> None:
    url, console = spawn_console(
        processes, database_url, app=APP, env={"KENNING_CONSOLE_ALLOWED_HOSTS": "console kenning.internal"}
    )
    await console_ready(url, console)
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        # no token: loopback names and the allowed ones only (a DNS-rebound page has its own)
        for host, status in [("evil.example", 400), ("console:8300", 200), ("KENNING.internal", 200)]:
            assert (await client.get("/start", headers={"host": host})).status_code == status, host
        form = await client.get("/start", params={"workflow": "shop.order"})
        assert form.status_code == 200
        assert "(order_id: str, quantity: int = 1)" in html.unescape(form.text)

        async def review(text: str) -> httpx.Response:
            fields = {"workflow": "shop.order", "input": text, "instance_id": "", "idempotency_key": ""}
            return await post_form(client, "/start", {**fields, "step": "review"})

        for text, status, words in [
            ('{"order_id": ', 400, "not valid JSON"),
            ("[1, 2]", 422, "must be a JSON object"),
            ('{"order_id": "o-1", "quantity": "many"}', 422, "quantity"),
            ('{"order": "o-1"}', 422, "order"),
            ("[" * 100_000, 400, "nested too deeply"),
        ]:
            answer = await review(text)
            assert answer.status_code == status, (text, answer.text)
            assert 'role="alert"' in answer.text and words in html.unescape(answer.text)
            assert text.strip() in html.unescape(answer.text)  # the input stays in the form to fix
        assert sql.execute("SELECT count(*) FROM kenning_instances").fetchone() == (0,)

        confirm = await review('{"order_id": "o-1", "quantity": 3}')
        assert confirm.status_code == 200 and "Start this workflow?" in confirm.text
        assert sql.execute("SELECT count(*) FROM kenning_instances").fetchone() == (0,)  # nothing before confirming
        instance_id = await _start(client, "shop.order", {"order_id": "o-2", "quantity": 3})
        row = sql.execute("SELECT workflow_name, status, input FROM kenning_instances WHERE id = %s", [instance_id])
        assert row.fetchone() == ("shop.order", "pending", {"order_id": "o-2", "quantity": 3})
        # confirmed again (a second tab, the back button): the instance it names, said so
        fields = {"workflow": "shop.order", "input": '{"order_id": "o-9"}', "idempotency_key": ""}
        again = await post_form(client, "/start", {**fields, "instance_id": instance_id, "step": "confirm"})
        assert again.status_code == 303 and again.headers["location"] == f"/instances/{instance_id}?existed=1"
        page = await client.get(again.headers["location"])
        assert "already existed: not started again" in page.text
    started = action_lines(processes.log_of(console), "start")
    assert [(line["instance_id"], line["created"]) for line in started] == [(instance_id, True), (instance_id, False)]


async def test_cancel_send_and_the_events_pages_with_the_admin_token(
    processes: ProcessPool, database: Database, database_url: str, sql: Sql
) -> None:
    url, console = spawn_console(
        processes, database_url, app=APP, token="s3cret", env={"KENNING_CONSOLE_PAGE_SIZE": "2"}
    )
    await console_ready(url, console)
    headers = {"Authorization": "Bearer s3cret"}
    async with httpx.AsyncClient(base_url=url, timeout=10, headers=headers) as client:
        instance_id = await _start(client, "shop.order", {"order_id": "o-3"})
        page = await client.get(f"/instances/{instance_id}/cancel")
        assert page.status_code == 200 and "compensations" in page.text
        assert (await client.post(f"/instances/{instance_id}/cancel")).status_code == 303  # bearer: no CSRF needed
        row = sql.execute("SELECT cancel_requested FROM kenning_instances WHERE id = %s", [instance_id]).fetchone()
        assert row == (True,)
        sql.execute("UPDATE kenning_instances SET status = 'cancelled' WHERE id = %s", [instance_id])
        again = await client.post(f"/instances/{instance_id}/cancel")
        assert again.status_code == 409 and "already cancelled" in again.text
        assert (await client.get("/instances/nobody/cancel")).status_code == 404

        event = {"type": "audit.recorded", "source": "/ops", "id": "ev-1", "subject": "", "data": '{"n": 1}'}
        bad = await client.post("/events/send", data={**event, "data": "{nope", "step": "review"})
        assert bad.status_code == 422 and "not valid JSON" in bad.text
        deep = await client.post("/events/send", data={**event, "data": "[" * 100_000, "step": "review"})
        assert deep.status_code == 422 and "nested too deeply" in deep.text
        untyped = await client.post("/events/send", data={**event, "type": "", "step": "review"})
        assert untyped.status_code == 422 and "needs a type" in untyped.text
        review = await client.post("/events/send", data={**event, "step": "review"})
        assert review.status_code == 200 and "Send this event?" in review.text
        assert sql.execute("SELECT count(*) FROM kenning_inbox").fetchone() == (0,)
        sent = await client.post("/events/send", data={**event, "step": "confirm"})
        assert sent.headers["location"] == "/events/inbox?sent=1"
        resent = await client.post("/events/send", data={**event, "step": "confirm"})
        assert resent.headers["location"] == "/events/inbox?sent=0"  # unique by source and id, as at the ingress
        stored = sql.execute("SELECT event_type, source, attributes, data, status FROM kenning_inbox").fetchall()
        assert stored == [
            (
                "audit.recorded",
                "/ops",
                {
                    "specversion": "1.0",
                    "id": "ev-1",
                    "source": "/ops",
                    "type": "audit.recorded",
                    "datacontenttype": "application/json",
                },
                {"n": 1},
                "pending",
            )
        ]

        # the inbox, parked rows with their reason, a page at a time, and a retry
        ids = await _events(database, 3, "audit.recorded")
        sql.execute(
            "UPDATE kenning_inbox SET status = 'failed', last_error = 'TerminalError: read-only' WHERE id = %s",
            [ids[0]],
        )
        first = await client.get("/events/inbox")
        older = re.search(r'href="(/events/inbox\?[^"]*before=(\d+))"', first.text)
        assert older is not None and int(older[2]) == ids[-2]
        second = await client.get(html.unescape(older[1]))
        assert f'id="inbox-{ids[0]}"' in second.text and "TerminalError: read-only" in second.text
        assert "parked: 1" in first.text
        assert "no receiver</span>" not in first.text
        # an event processed with nothing to receive it says so
        sql.execute("UPDATE kenning_inbox SET status = 'processed', no_receiver = true WHERE id = %s", [ids[-1]])
        marked = await client.get("/events/inbox")
        marked_row = re.search(rf'<tr id="inbox-{ids[-1]}">.*?</tr>', marked.text, re.S)
        assert marked_row is not None and "no receiver</span>" in marked_row[0]
        assert (await client.get("/events/inbox", params={"before": "x"})).status_code == 400
        retried = await client.post(f"/events/inbox/{ids[0]}/retry")
        assert retried.status_code == 303
        assert sql.execute("SELECT status FROM kenning_inbox WHERE id = %s", [ids[0]]).fetchone() == ("pending",)
        assert (await client.post(f"/events/inbox/{ids[0]}/retry")).status_code == 409

        # the outbox: a dead letter with the broker's answer, retried
        dead = (await insert_events(database, 1))[0]
        sql.execute(
            "UPDATE kenning_outbox SET status = 'failed', last_error = '422 from the broker: bad schema' WHERE id = %s",
            [dead],
        )
        letters = await client.get("/events/outbox", params={"status": "failed"})
        assert dead in letters.text and "422 from the broker: bad schema" in letters.text
        assert (await client.post(f"/events/outbox/{dead}/retry")).status_code == 303
        assert sql.execute("SELECT status, attempts FROM kenning_outbox WHERE id = %s", [dead]).fetchone() == (
            "pending",
            0,
        )
        assert (await client.get("/events/outbox/not-a-uuid/retry")).status_code == 404
    async with httpx.AsyncClient(base_url=url, timeout=10) as stranger:
        assert (await stranger.post(f"/instances/{instance_id}/cancel")).status_code == 401
    log = processes.log_of(console)
    assert [(line["instance_id"], line["who"]) for line in action_lines(log, "cancel")] == [
        (instance_id, "admin (bearer)"),
        (instance_id, "admin (bearer)"),
    ]
    assert [line["stored"] for line in action_lines(log, "send")] == [True, False]
    assert len(action_lines(log, "inbox_retry")) == 2 and len(action_lines(log, "outbox_retry")) == 1
