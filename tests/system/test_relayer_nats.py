"""The relayer publishing to the machine's NATS JetStream (``nats://`` broker URLs), as a
real process: the CloudEvents NATS binding in both content modes, the JetStream ack, a
crash after the ack (the re-send carries the same Nats-Msg-Id and the stream drops it), the
server unreachable at start and the network cut mid-run, rejected publishes dead-lettered
with the server's answer, and the start-time errors. Each test has a stream of its own."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import psycopg
import pytest

from kenning.db import Database
from kenning.observability.faults import CRASH_EXIT_CODE
from kenning_relayer.nats import NatsAddress, NatsTarget
from kenning_relayer.publish import RetrySchedule
from kenning_relayer.settings import RelayerSettings
from tests.brokers import jetstream_stream, nats_unreachable_reason, stream_messages, tcp_proxy, with_query
from tests.logguard import expect_log
from tests.relayer_support import (
    awkward_event_expected,
    awkward_event_in_the_inbox,
    ce_headers,
    check_outbox_invariants,
    delivered_once,
    insert_awkward_event,
    insert_events,
    insert_varied_events,
    outbox_row,
    placed_attributes,
    published_across_a_cut,
    relayer_process,
    relayer_without,
    relaying,
    retried_as_unreachable,
    running_relayer,
    statuses,
)
from tests.sources_support import start_consuming_ingress
from tests.support import ProcessPool, eventually

SQL = psycopg.Connection[tuple[object, ...]]


BROKER = ("--request-timeout-seconds", "3")


CRASH_AFTER_SEND = "relayer.after_send=crash@1"


pytestmark = pytest.mark.skipif(nats_unreachable_reason() is not None, reason=str(nats_unreachable_reason()))


@pytest.mark.parametrize("mode", ["binary", "structured"])
async def test_events_are_acked_by_jetstream_in_the_nats_binding(
    database: Database, database_url: str, sql: SQL, processes: ProcessPool, mode: str
) -> None:
    async with jetstream_stream() as stream:
        url = stream.relayer_url(subject=stream.subject("{type}"))
        async with relaying(mode, processes, database, database_url, url, *BROKER):
            ids = await insert_varied_events(database)
            await eventually(lambda: statuses(sql) == {"published": len(ids)}, timeout=30, message="all acked")
        stored = await stream_messages(stream)
    assert len(stored) == len(ids)
    got = {m.headers["Nats-Msg-Id"]: m for m in stored}  # the dedup key is the CloudEvent id
    assert set(got) == set(ids.values())
    # one instance's events are stored in creation order
    order = [m.headers["Nats-Msg-Id"] for m in stored if m.subject == stream.subject("step.done")]
    assert order == [ids["first"], ids["second"], ids["third"]]
    placed = got[ids["json"]]
    assert placed.subject == stream.subject("order.placed")  # the template, filled from the event
    if mode == "binary":
        headers = dict(placed.headers)
        time = headers.pop("ce-time")
        assert time.endswith("Z")
        # ce-datacontenttype is among them: the binding's place for it, not content-type
        assert headers == {"Nats-Msg-Id": ids["json"], **ce_headers(placed_attributes(ids["json"], binary=True))}
        assert json.loads(placed.data) == {"order_id": "o-9", "total": 42}
        blob = got[ids["blob"]]
        assert blob.data == b"\xff" and "ce-datacontenttype" not in blob.headers
        text = got[ids["text"]]
        assert (text.headers["ce-datacontenttype"], text.data) == ("text/plain", b"thank you")
    else:
        assert all(
            set(m.headers) == {"Nats-Msg-Id", "content-type"}
            and m.headers["content-type"] == "application/cloudevents+json"
            for m in stored
        )
        event = json.loads(placed.data)
        event.pop("time")
        assert event == {**placed_attributes(ids["json"], binary=False), "data": {"order_id": "o-9", "total": 42}}
        assert json.loads(got[ids["blob"]].data)["data_base64"] == "/w=="
    check_outbox_invariants(sql)


async def test_kenning_to_kenning_relayer_to_jetstream_to_a_nats_source_keeps_every_attribute(
    database: Database, database_url: str, sql: SQL, processes: ProcessPool
) -> None:
    """The relayer's binary mode read by ``kenning ingress --source nats://``: the inbox row
    holds the outbox event's attributes exactly."""
    async with jetstream_stream() as stream:
        start_consuming_ingress(processes, database_url, with_query(stream.url, stream=stream.name, consumer="k"))
        event_id = await insert_awkward_event(database)
        async with running_relayer(database, stream.relayer_url(subject=stream.subject("{type}"))):
            await eventually(lambda: statuses(sql) == {"published": 1}, timeout=20, message="acked")
        await eventually(lambda: awkward_event_in_the_inbox(sql, event_id) is not None, timeout=20, message="stored")
    assert awkward_event_in_the_inbox(sql, event_id) == awkward_event_expected(event_id)


async def test_a_relayer_killed_after_the_ack_resends_and_jetstream_drops_the_duplicate(
    database: Database, database_url: str, sql: SQL, processes: ProcessPool
) -> None:
    lease = ("--lease-seconds", "1", *BROKER)
    async with jetstream_stream() as stream:
        url = stream.relayer_url(subject=stream.subject("{type}"))
        ids = await insert_events(database, 3)
        first = relayer_process(processes, database_url, url, *lease, env={"KENNING_FAULTS": CRASH_AFTER_SEND})
        assert await asyncio.to_thread(first.wait, 60) == CRASH_EXIT_CODE, processes.log_of(first)
        assert len(await stream_messages(stream)) == 3  # the stream has them ...
        assert statuses(sql) == {"publishing": 3}  # ... the outbox does not know it
        second = relayer_process(processes, database_url, url, *lease)
        await eventually(lambda: statuses(sql) == {"published": 3}, timeout=30, message="published by another relayer")
        stored = await stream_messages(stream)
    assert sorted(m.headers["Nats-Msg-Id"] for m in stored) == sorted(ids)  # each once: the re-sends were dropped
    assert all(outbox_row(sql, i)["attempts"] == 2 for i in ids)  # ... and they were sent
    log = processes.log_of(second).splitlines()
    dropped = [json.loads(line)["event_id"] for line in log if '"relayer.duplicate_dropped"' in line]
    assert sorted(dropped) == sorted(ids)
    check_outbox_invariants(sql)


async def test_a_server_down_at_start_and_a_cut_network_lose_nothing(
    database: Database, database_url: str, sql: SQL, processes: ProcessPool
) -> None:
    async with jetstream_stream() as stream, tcp_proxy(stream.url, 4222, started=False) as network:
        url = network.url(stream.relayer_url(subject=stream.subject("{type}")))
        relayer_process(processes, database_url, url, "--max-attempts", "1000", "--batch-size", "5", *BROKER)
        ids = await insert_events(database, 5)
        await eventually(
            lambda: retried_as_unreachable(sql, ids), timeout=30, message="attempts against a server that is down"
        )
        await network.start()
        await eventually(lambda: statuses(sql) == {"published": 5}, timeout=30, message="published once it is up")
        ids += await published_across_a_cut(network, database, sql)
        stored = await stream_messages(stream)
    assert sorted(m.headers["Nats-Msg-Id"] for m in stored) == sorted(ids)  # all there, each once
    log = "".join(processes.log_of(p) for p, _ in processes.procs)
    assert '"relayer.broker_unreachable"' in log and '"relayer.broker_connection_lost"' in log
    check_outbox_invariants(sql)


async def test_rejected_publishes_are_retried_then_dead_lettered_with_the_servers_answer(
    database: Database, database_url: str, sql: SQL, processes: ProcessPool
) -> None:
    expect_log("outbox.dead_lettered")
    async with jetstream_stream() as stream:
        # the subject is the event type: one type is in the stream, one in no stream at all
        relayer_process(processes, database_url, stream.relayer_url(), "--max-attempts", "3", *BROKER)
        lost = await insert_events(database, 2, event_type="nowhere.at.all")
        kept = await insert_events(database, 2, event_type=stream.subject("kept"))
        await eventually(lambda: statuses(sql) == {"failed": 2, "published": 2}, timeout=30, message="outcomes")
        stored = await stream_messages(stream)
    assert sorted(m.headers["Nats-Msg-Id"] for m in stored) == sorted(kept)  # they did not wait for the others
    for event_id in lost:
        row = outbox_row(sql, event_id)
        assert row["attempts"] == 3
        assert str(row["last_error"]) == (
            "gave up after 3 attempts; last error: no JetStream stream holds subject 'nowhere.at.all' (no responders)"
        )
    check_outbox_invariants(sql)


async def test_a_subject_in_another_stream_is_refused_by_the_server() -> None:
    """In process, no database: one attempt and its outcome (the server's refusal, retried)."""
    async with jetstream_stream() as stream:
        address = NatsAddress.parse(stream.relayer_url(subject=stream.subject("{type}"), stream="SOME_OTHER_STREAM"))
        outcome = await delivered_once(
            NatsTarget(address, RelayerSettings(request_timeout_seconds=3), RetrySchedule(5, 0.02, 0.1))
        )
        assert await stream_messages(stream) == []
    assert outcome.status == "pending"
    assert outcome.error == (
        "BadRequestError: nats: BadRequestError: code=400 err_code=10060 description='expected stream does not match'"
    )


def test_without_nats_py_the_relayer_stops_at_start_naming_the_extra(tmp_path: Path) -> None:
    result = relayer_without("nats", "nats://127.0.0.1:4222?subject=events.{type}", tmp_path)
    assert result.code == 2, result
    assert result.stderr.strip() == (
        "kenning relayer: nats:// broker URLs need the nats-py client: pip install 'kenning[nats]'"
    )
