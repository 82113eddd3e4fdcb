"""``@workflow``: a durable function, replayed from history on any worker."""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Awaitable, Callable
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, overload

from kenning.errors import ConfigurationError
from kenning.registry import REGISTRY
from kenning.schedules import check_overlap, parse_schedule

if TYPE_CHECKING:
    from kenning.client import StartedInstance
    from kenning.core.cron import CronSchedule
    from kenning.queues import Queue

R = TypeVar("R")

# Keyword options of the start calls (Client.start, Workflow.start, start_child): a workflow
# parameter of one of these names would be taken by the option instead of reaching the
# workflow, so ``@workflow`` refuses it.
RESERVED_PARAMETERS = frozenset(
    {
        "instance_id",
        "idempotency_key",
        "lock_timeout_seconds",
        "queue",
        "partition_key",
        "priority",
        "child_id",
        "on_parent_cancel",
    }
)


class Workflow(Generic[R]):
    def __init__(
        self,
        func: Callable[..., Awaitable[R]],
        *,
        name: str | None = None,
        event_handler: bool = False,
        lock_timeout_seconds: float | None = None,
        schedule: str | None = None,
        timezone: str | None = None,
        retention: timedelta | None = None,
        queue: Queue | str | None = None,
        overlap: str | None = None,
        timeout: float | timedelta | None = None,
    ) -> None:
        if not inspect.iscoroutinefunction(func):
            raise TypeError(f"workflow {func.__qualname__} must be an async function")
        self.func = func
        self.name = name or func.__name__
        _check_parameter_names(self.name, func)
        self.event_handler = event_handler
        self.lock_timeout_seconds = lock_timeout_seconds
        self.schedule = schedule
        self.timezone = timezone
        if timezone is not None and schedule is None:
            raise ConfigurationError(f"workflow {self.name!r}: timezone= needs schedule=")
        # The cron schedule the scheduler process starts it on (checked here, at import).
        self.cron: CronSchedule | None = parse_schedule(self.name, schedule, timezone) if schedule is not None else None
        # what a tick does while the schedule's last instance runs (kenning/schedules.py)
        self.overlap = check_overlap(self.name, overlap, schedule)
        if retention is not None and (not isinstance(retention, timedelta) or retention <= timedelta(0)):
            raise ConfigurationError(f"workflow {self.name!r}: retention= must be a positive timedelta")
        # How long the scheduler keeps a finished instance and its history (its definition
        # row carries it to the scheduler); None: the scheduler's --instance-retention-days.
        self.retention = retention
        # the queue its instances start in unless a start names one (kenning/queues.py)
        self.queue: str | None = _queue_name(self.name, queue)
        # seconds from its start until it fails with WorkflowTimeoutError (None: never)
        self.timeout = _timeout_seconds(self.name, timeout)
        self.__name__ = func.__name__
        self.__qualname__ = func.__qualname__
        self.__module__ = func.__module__
        self.__doc__ = func.__doc__
        self.__wrapped__ = func

    @cached_property
    def source(self) -> str:
        try:
            return inspect.getsource(self.func)
        except (OSError, TypeError):
            return ""

    @cached_property
    def source_hash(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()

    @property
    def retention_seconds(self) -> float | None:
        return None if self.retention is None else self.retention.total_seconds()

    async def start(
        self,
        *,
        instance_id: str | None = None,
        idempotency_key: str | None = None,
        lock_timeout_seconds: float | None = None,
        **kwargs: Any,
    ) -> str:
        """Start an instance through the default client (``KENNING_DATABASE_URL``).

        Returns the instance id. Unlike Edda 0.1.0 this does not run the workflow in the
        caller: a worker process picks it up. ``lock_timeout_seconds`` is accepted for
        Edda compatibility; leases are set by the worker (``--lease-seconds``).
        """
        from kenning.client import default_client

        started: StartedInstance = await default_client().start(
            self, instance_id=instance_id, idempotency_key=idempotency_key, **kwargs
        )
        return started.instance_id

    def __repr__(self) -> str:
        return f"<workflow {self.name}>"


class WorkflowDecorator(Protocol):
    def __call__(self, func: Callable[..., Awaitable[R]], /) -> Workflow[R]: ...


@overload
def workflow(func: Callable[..., Awaitable[R]], /) -> Workflow[R]: ...
@overload
def workflow(
    *,
    event_handler: bool = False,
    lock_timeout_seconds: float | None = None,
    name: str | None = None,
    schedule: str | None = None,
    timezone: str | None = None,
    retention: timedelta | None = None,
    queue: Queue | str | None = None,
    overlap: str | None = None,
    timeout: float | timedelta | None = None,
) -> WorkflowDecorator: ...


def workflow(
    func: Callable[..., Awaitable[Any]] | None = None,
    /,
    *,
    event_handler: bool = False,
    lock_timeout_seconds: float | None = None,
    name: str | None = None,
    schedule: str | None = None,
    timezone: str | None = None,
    retention: timedelta | None = None,
    queue: Queue | str | None = None,
    overlap: str | None = None,
    timeout: float | timedelta | None = None,
) -> Workflow[Any] | WorkflowDecorator:
    """``@workflow`` or ``@workflow(event_handler=True)``: register a durable workflow.

    With ``event_handler=True`` a CloudEvent whose type equals the workflow's name starts it.
    With ``schedule="*/5 * * * *"`` the scheduler process starts it on every cron tick, in
    UTC or in ``timezone`` (an IANA name such as ``"Europe/Paris"``); ``overlap="skip"`` or
    ``"buffer_one"`` holds a tick back while the schedule's last instance runs (default
    ``"allow"``).
    With ``retention=timedelta(days=7)`` the scheduler deletes a finished instance and its
    history a week after it ended (default: the scheduler's ``--instance-retention-days``).
    With ``queue="payments"`` (a name or a ``kenning.Queue``) its instances start in that
    queue, whose limits the claim enforces, unless a start names another.
    With ``timeout=timedelta(days=30)`` (or seconds) an instance still unfinished 30 days
    after its start is cancelled by the scheduler, compensated, and ends ``failed`` with
    ``WorkflowTimeoutError``.
    """

    def wrap(f: Callable[..., Awaitable[Any]]) -> Workflow[Any]:
        wf: Workflow[Any] = Workflow(
            f,
            name=name,
            event_handler=event_handler,
            lock_timeout_seconds=lock_timeout_seconds,
            schedule=schedule,
            timezone=timezone,
            retention=retention,
            queue=queue,
            overlap=overlap,
            timeout=timeout,
        )
        REGISTRY.add_workflow(wf)
        return wf

    return wrap(func) if func is not None else wrap


def _check_parameter_names(workflow_name: str, func: Callable[..., Any]) -> None:
    # the first parameter is the context, passed positionally; *args and **kwargs take no name
    named = list(inspect.signature(func).parameters.values())[1:]
    for parameter in named:
        if parameter.name in RESERVED_PARAMETERS and parameter.kind in (
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            inspect.Parameter.KEYWORD_ONLY,
        ):
            raise ConfigurationError(
                f"workflow {workflow_name!r}: parameter {parameter.name!r} is a start option's name "
                f"({', '.join(sorted(RESERVED_PARAMETERS))}): rename it"
            )


def _timeout_seconds(workflow_name: str, timeout: float | timedelta | None) -> float | None:
    from kenning.activity import timeout_seconds

    return timeout_seconds(timeout, f"workflow {workflow_name!r}")


def _queue_name(workflow_name: str, queue: Queue | str | None) -> str | None:
    from kenning.queues import Queue, check_queue_name

    if queue is None or isinstance(queue, Queue):
        return None if queue is None else queue.name
    try:
        return check_queue_name(queue)
    except ConfigurationError as error:
        raise ConfigurationError(f"workflow {workflow_name!r}: queue=: {error}") from None
