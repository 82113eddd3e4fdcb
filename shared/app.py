"""``kenning.App``: what belongs to user code — hooks, retry defaults, event handlers.

The counterpart of Edda's ``EddaApp`` without the connection: each process (worker,
ingress, scheduler, relayer) takes its database URL from its own environment and flags,
so one module serves every process.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from kenning.hooks import WorkflowHooks
from kenning.registry import REGISTRY, Registry
from kenning.retry import RetryPolicy

H = TypeVar("H", bound=Callable[..., Awaitable[Any]])


class App:
    def __init__(
        self,
        service_name: str = "kenning",
        *,
        hooks: WorkflowHooks | Any | None = None,
        default_retry_policy: RetryPolicy | None = None,
        db_url: str | None = None,
        outbox_enabled: bool = False,
        broker_url: str | None = None,
        registry: Registry | None = None,
    ) -> None:
        # db_url, outbox_enabled and broker_url are Edda's EddaApp arguments; kept so an
        # Edda module imports unchanged. db_url is only a fallback for KENNING_DATABASE_URL.
        self.service_name = service_name
        self.hooks = hooks
        self.default_retry_policy = default_retry_policy
        self.db_url = db_url
        self.outbox_enabled = outbox_enabled
        self.broker_url = broker_url
        self.registry = registry or REGISTRY
        self.event_handlers: dict[str, list[Callable[..., Awaitable[Any]]]] = {}

    def on_event(self, event_type: str, proto_type: Any = None) -> Callable[[H], H]:
        """Register ``async def handler(event)`` for CloudEvents of ``event_type``.

        Handlers run in a worker, in the transaction that marks the inbox row processed.
        """

        def decorator(func: H) -> H:
            self.event_handlers.setdefault(event_type, []).append(func)
            return func

        return decorator


EddaApp = App
