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

Edda programs make their ``EddaApp(db_url=...)`` in ``main()`` and call ``wf.start()``
there: ``db_url`` is also the database of ``wf.start()`` in the process that made the App
(``KENNING_DATABASE_URL`` first, as everywhere), and ``initialize()``/``shutdown()`` are
Edda's bracket around it. Hooks run in the worker that runs an instance, which finds the
App among its ``--app`` modules' attributes: an App with hooks made inside a function is
found by none, so its hooks would never run; the first ``wf.start()`` of such a process
says so (``app.hooks_not_loaded``), once per App, instead of nothing at all.
"""

from __future__ import annotations

import os
import sys
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import structlog

from kenning.core.database_urls import sqlalchemy_url
from kenning.core.urls import hide_credentials
from kenning.errors import ConfigurationError
from kenning.hooks import WorkflowHooks
from kenning.registry import REGISTRY, Registry
from kenning.retry import RetryPolicy

H = TypeVar("H", bound=Callable[..., Awaitable[Any]])

_log = structlog.get_logger("kenning.app")
_outbox_hint_given = False
_hooks_warned: weakref.WeakSet[App] = weakref.WeakSet()  # Apps whose unloaded hooks were reported


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
        self.registry.apps.add(self)
        if outbox_enabled:
            _outbox_hint()

    async def initialize(self) -> None:
        """Edda's ``await app.initialize()``: check that ``wf.start()`` has a database
        (``KENNING_DATABASE_URL`` or this App's ``db_url``), now rather than at the first
        start. Nothing else: the schema is ``kenning migrate``'s, and workers, the ingress,
        the scheduler and the relayer are processes of their own. Idempotent."""
        if not (os.environ.get("KENNING_DATABASE_URL") or database_url_of_apps(self.registry)):
            raise ConfigurationError(
                "App.initialize(): no database: pass App(db_url='postgresql://...') or set KENNING_DATABASE_URL"
            )

    async def shutdown(self) -> None:
        """Edda's ``await app.shutdown()``: close the connections ``wf.start()`` opened in
        this event loop (its starts are announced to the workers first)."""
        from kenning.workflow import close_default_client

        await close_default_client()

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


def database_url_of_apps(registry: Registry) -> str | None:
    """The ``db_url`` the live Apps of ``registry`` give (None: none gives one); Apps that
    give different ones leave the choice to the caller, said so."""
    urls = sorted({app.db_url for app in list(registry.apps) if app.db_url})
    if len(urls) > 1:
        shown = ", ".join(hide_credentials(url) for url in urls)
        raise ConfigurationError(
            f"Apps of this process name {len(urls)} databases ({shown}): set KENNING_DATABASE_URL "
            "or start with kenning.Client(url)"
        )
    return urls[0] if urls else None


def warn_unloaded_hooks(registry: Registry) -> None:
    """Warn, once per App, of hooks no worker will run: a worker runs the hooks of the App
    it finds among its ``--app`` modules' attributes, and this one is no module's (made in
    a function, as Edda's examples make theirs in ``main()``)."""
    apps = [app for app in list(registry.apps) if app.hooks is not None and app not in _hooks_warned]
    if not apps:
        return
    reachable = {id(value) for module in list(sys.modules.values()) for value in _attributes(module)}
    for app in apps:
        _hooks_warned.add(app)
        if id(app) in reachable:
            continue
        _log.warning(
            "app.hooks_not_loaded",
            service_name=app.service_name,
            hint="hooks run in the worker that runs each instance, and a worker runs the hooks of "
            "the App it finds in its --app modules; this App was made inside a function, so no "
            "worker finds it and its hooks never run: make it at module level and run "
            "`kenning worker --app <that module>`",
        )


def _attributes(module: object) -> list[object]:
    try:
        return list(vars(module).values())
    except TypeError:  # an object in sys.modules without a __dict__
        return []


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
