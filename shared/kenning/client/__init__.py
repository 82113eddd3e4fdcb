"""``kenning.Client``: start, inspect, await and cancel workflow instances.

The public face is here; the pieces are modules of this package: ``client`` (``Client``
and the default client), and what it does with the database: ``starts`` (starts batched
into group-committed inserts), ``folding`` (a debounced start or a batched event folded
into its key's burst), ``results`` (the waits for results on one shared LISTEN
connection), ``streams`` (stream readers on that connection), ``unavailable`` (a
database that is away: the calls safe to repeat retried), ``forks`` (a fork of an
instance at a step).
"""

from kenning.client.client import (
    Client,
    InvalidInputError,
    ResultTimeoutError,
    StartedInstance,
    close_default_client,
    default_client,
)

__all__ = [
    "Client",
    "InvalidInputError",
    "ResultTimeoutError",
    "StartedInstance",
    "close_default_client",
    "default_client",
]
