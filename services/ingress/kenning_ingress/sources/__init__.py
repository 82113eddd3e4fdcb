"""Broker sources: ``kenning ingress --source URL`` consumes CloudEvents from RabbitMQ
(``amqp.py``) or NATS JetStream (``nats.py``) into the inbox, beside the HTTP endpoint.

They run inside each ingress process (each uvicorn worker), started and stopped by the
app's lifespan: a source does what a ``POST`` does (decode, validate, write to the inbox,
answer), so it shares the process's group commit and database pool, and ``--workers N``
makes N competing consumers of each source. ``base.py`` holds what every source does with
a message, ``bindings.py`` the CloudEvents protocol bindings, ``addresses.py`` the URL forms.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

import structlog

from kenning_ingress.parsing import EventLimits
from kenning_ingress.sources.addresses import AmqpSourceAddress, parse_source, require_client
from kenning_ingress.sources.base import Intake, Store

_log = structlog.get_logger("kenning.ingress.source")


class Source(Protocol):
    async def run(self) -> None:
        """Consume until cancelled; never returns otherwise."""
        ...


def check_sources(urls: Sequence[str]) -> None:
    """Refuse (``ConfigurationError``, one line) a URL naming no source, or one whose
    broker client is not installed; before the ingress starts."""
    for url in urls:
        require_client(parse_source(url))


def open_source(url: str, store: Store, limits: EventLimits, max_body_bytes: int) -> Source:
    address = parse_source(url)
    intake = Intake(address.name, store, limits, max_body_bytes)
    if isinstance(address, AmqpSourceAddress):
        from kenning_ingress.sources.amqp import AmqpSource

        return AmqpSource(address, intake)
    from kenning_ingress.sources.nats import NatsSource

    return NatsSource(address, intake)


@contextlib.asynccontextmanager
async def running_sources(
    urls: Sequence[str], store: Store, limits: EventLimits, max_body_bytes: int
) -> AsyncIterator[None]:
    """Every source consuming for the body's duration; stopped (connections closed, so
    what they held unacknowledged goes back to its broker) when it ends. ``limits`` and
    ``max_body_bytes`` are the HTTP endpoint's: a message is held to what a request is."""
    tasks = [
        asyncio.create_task(open_source(url, store, limits, max_body_bytes).run(), name=parse_source(url).name)
        for url in urls
    ]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        for task, outcome in zip(tasks, await asyncio.gather(*tasks, return_exceptions=True), strict=True):
            if isinstance(outcome, Exception):
                _log.error("source.crashed", source=task.get_name(), error=repr(outcome), exc_info=outcome)
