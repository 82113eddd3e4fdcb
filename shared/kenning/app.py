"""``kenning.App``: what belongs to user code — hooks, retry defaults, event handlers.

The counterpart of Edda's ``EddaApp``, with its arguments in its order:
``App(service_name, db_url, outbox_enabled, broker_url, hooks, default_retry_policy)``.
Each process (worker, ingress, scheduler, relayer) takes its database URL from its own
environment and flags, so one module serves every process; ``db_url`` is the fallback when
``KENNING_DATABASE_URL``/``--database-url`` is not given, for the processes that load the
App (``kenning worker``, ``scheduler``, ``relayer --app``, ``up``). Kenning's outbox always
records events and a separate ``kenning relayer`` publishes them: ``broker_url`` is that
relayer's fallback for ``--broker-url`` when it loads the App, and ``outbox_enabled=True``
(Edda's in-process relayer) says, once, to run one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import structlog

from kenning.core.database_urls import sqlalchemy_url
from kenning.errors import ConfigurationError
from kenning.hooks import WorkflowHooks
from kenning.registry import REGISTRY, Registry
from kenning.retry import RetryPolicy

H = TypeVar("H", bound=Callable[..., Awaitable[Any]])

_log = structlog.get_logger("kenning.app")
_outbox_hint_given = False


class App:
    def __init__(
        self,
        service_name: str = "kenning",
        db_url: str | None = None,
        outbox_enabled: bool = False,
        broker_url: str | None = None,
        hooks: WorkflowHooks | Any | None = None,
        default_retry_policy: RetryPolicy | None = None,
        *,
        registry: Registry | None = None,
    ) -> None:
        self.service_name = service_name
        self.hooks = hooks
        self.default_retry_policy = default_retry_policy
        self.db_url = _checked_db_url(db_url)
        self.outbox_enabled = outbox_enabled
        self.broker_url = broker_url or None
        self.registry = registry or REGISTRY
        self.event_handlers: dict[str, list[Callable[..., Awaitable[Any]]]] = {}
        if outbox_enabled:
            _outbox_hint()

    def on_event(self, event_type: str, proto_type: Any = None) -> Callable[[H], H]:
        """Register ``async def handler(event)`` for CloudEvents of ``event_type``.

        Handlers run in a worker, in the transaction that marks the inbox row processed.
        """

        def decorator(func: H) -> H:
            self.event_handlers.setdefault(event_type, []).append(func)
            return func

        return decorator


def _checked_db_url(db_url: str | None) -> str | None:
    """A PostgreSQL URL or None; Edda's other databases (SQLite, MySQL) are refused here,
    at import, rather than when a process first connects."""
    if not db_url:
        return None
    try:
        sqlalchemy_url(db_url)
    except ConfigurationError:
        scheme = db_url.split("://", 1)[0] + "://" if "://" in db_url else "no scheme"  # never the password
        raise ConfigurationError(
            f"App(db_url=...) must be a postgresql:// URL, got {scheme} (Kenning runs on PostgreSQL only): "
            "pass a postgresql:// URL, or leave db_url out and set KENNING_DATABASE_URL"
        ) from None
    return db_url


def _outbox_hint() -> None:
    """Edda's ``outbox_enabled=True`` started a relayer inside the app; Kenning's is a
    process of its own, which this says once per process."""
    global _outbox_hint_given
    if _outbox_hint_given:
        return
    _outbox_hint_given = True
    _log.warning(
        "app.outbox_enabled",
        hint="Kenning's outbox always records send_event_transactional events; publish them with a "
        "separate process: run `kenning relayer --app <module>` (it takes this App's broker_url) "
        "or `kenning relayer --broker-url URL`",
    )


EddaApp = App
