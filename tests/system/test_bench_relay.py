"""``kenning bench --sections relay`` on a tiny run: relayers crashing after the broker
answered, restarted until done, against each target (HTTP sink, RabbitMQ, JetStream).
Every event arrives; a crash re-sends at most its batch; JetStream stores each event once."""

from __future__ import annotations

from kenning_devtools.bench.main import section_list
from kenning_devtools.bench.relay import run_relay
from tests.brokers import AMQP_URL, NATS_URL, nats_unreachable_reason, rabbitmq_unreachable_reason

EVENTS, BATCH = 20, 10


async def test_crashing_relayers_deliver_every_event_at_least_once_and_jetstream_stores_each_once(
    database_url: str,
) -> None:
    assert section_list("relay") == ["relay"]  # a section of kenning bench, run when named
    report = await run_relay(database_url, EVENTS, 10, BATCH, 0.5, AMQP_URL, NATS_URL, timeout=60)
    runs = {run["target"]: run for run in report["targets"]}
    assert list(runs) == ["http", "amqp", "nats"]
    for name, reason in (("amqp", rabbitmq_unreachable_reason()), ("nats", nats_unreachable_reason())):
        if reason is not None:  # reported, never silently left out
            assert runs.pop(name)["skipped"].startswith(("RabbitMQ", "NATS")), reason
    for run in runs.values():
        assert run["crashes"] >= 1, run  # the fault fired: this counts a re-send, not a clean run
        assert (run["distinct"], run["missing"]) == (EVENTS, 0), run  # every id delivered
        assert run["sends"] > EVENTS, run  # the crashed batches were sent again ...
        assert run["duplicates"] <= run["crashes"] * BATCH, run  # ... at most one batch per crash
    for name in ("http", "amqp"):
        if name in runs:
            assert runs[name]["messages"] == runs[name]["sends"], runs[name]  # each send arrived
    if "nats" in runs:
        assert (runs["nats"]["messages"], runs["nats"]["duplicates"]) == (EVENTS, 0), runs["nats"]  # dropped by id
