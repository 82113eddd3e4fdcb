"""What the ingress's AMQP source and the relayer's AMQP target share, with no aio-pika
import (a URL is checked whether or not the ``amqp`` extra is installed): the URL options
passed on to aio-pika, the vhost a URL names, and the filter on aiormq's own log lines."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from urllib.parse import SplitResult, unquote, urlencode, urlunsplit

CONNECTION_OPTIONS = ("heartbeat", "cafile", "certfile", "keyfile", "no_verify_ssl")  # aio-pika's own


def connection_url(parsed: SplitResult, options: Mapping[str, str]) -> str:
    """The URL aio-pika connects to: ``parsed`` with only aio-pika's own options kept."""
    passed_on = {key: value for key, value in options.items() if key in CONNECTION_OPTIONS}
    return urlunsplit(parsed._replace(query=urlencode(passed_on), fragment=""))


def vhost_of(parsed: SplitResult) -> str:
    """The vhost the URL's path names (percent-encoded: ``%2F``, or no path, is ``/``)."""
    return unquote(parsed.path[1:]) or "/"


class _ReportedByKenning(logging.Filter):
    """Drops aiormq's lines (error level, or a warning with a traceback) for a broker that
    is down or closed the connection: Kenning's source and target report each in one
    warning of their own (``source.disconnected``, ``relayer.broker_unreachable``,
    ``relayer.broker_connection_lost``) and connect again."""

    MESSAGES = (
        "error when creating transport",
        "Unexpected connection close from remote",
        "Cancelling cause reader exited abnormally",
    )

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(self.MESSAGES))


_AIORMQ_FILTER = _ReportedByKenning()


def quiet_aiormq() -> None:
    """Install the filter on aiormq's connection logger (once: a logger's filters are a set)."""
    logging.getLogger("aiormq.connection").addFilter(_AIORMQ_FILTER)
