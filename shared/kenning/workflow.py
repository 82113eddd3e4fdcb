"""``@workflow``: a durable function, replayed from history on any worker.

A ``Workflow[R, P]`` returns ``R`` and takes ``P`` after its context, so every start
(``Client.start``, ``wf.start``, ``start_child``) is checked against its parameters and
``Client.result`` returns ``R``. PEP 612 allows no keyword beside a function's own
parameters, so options are given apart, with ``wf.options(instance_id=..., queue=...)``,
which returns the workflow with those options, checked as any start. Options mixed with the
arguments (``client.start(wf, order_id="o-1", instance_id="o-1")``, Edda's and Kenning's
first form) still work, through overloads that leave the arguments unchecked.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any, Concatenate, Generic, Literal, NoReturn, Protocol, cast, get_args, overload

from typing_extensions import ParamSpec, TypeVar

from kenning.core.limits import MAX_VALUE_KEY_LENGTH
from kenning.core.names import STATUS_VALUE_KEY
from kenning.errors import ConfigurationError
from kenning.registry import REGISTRY
from kenning.schedules import check_overlap, parse_schedule

if TYPE_CHECKING:
    from kenning.client import StartedInstance
    from kenning.context import WorkflowContext
    from kenning.core.cron import CronSchedule
    from kenning.flow import Batch, Debounce
    from kenning.queues import Queue

# The result first and the parameters defaulted (PEP 696), so ``Workflow[float]`` still
# names a workflow returning a float, whatever it takes, as before parameters were typed.
R = TypeVar("R", default=Any)
P = ParamSpec("P", default=...)
R2 = TypeVar("R2")
P2 = ParamSpec("P2")

# Which workers may run an instance (docs/operations.md#version-pinning): ``auto_upgrade``,
# any worker that runs the workflow (a deploy replays unfinished instances on the new code);
# ``pinned``, only workers of the code version it started on (a worker's ``code_version``).
Versioning = Literal["auto_upgrade", "pinned"]
VERSIONINGS: tuple[str, ...] = get_args(Versioning)

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


@dataclass(frozen=True)
class StartOptions:
    """How a start is made, given with ``wf.options(...)``; None: not given. ``instance_id``
    is a child's id under ``start_child``; ``idempotency_key`` applies to a client's start
    only, ``on_parent_cancel`` to a child's only."""

    instance_id: str | None = None
    idempotency_key: str | None = None
    queue: str | None = None
    partition_key: str | None = None
    priority: int | None = None
    on_parent_cancel: str | None = None
    timeout: float | None = None  # seconds: this start's workflow timeout
    search_attributes: dict[str, Any] | None = None  # declared keys, set with the instance's row
    debounce: Debounce | None = None  # this start's debounce, instead of @workflow(debounce=...)

    def merged(self, **given: Any) -> dict[str, Any]:
        """These options with the ones a call gave as keywords (None: not given); one given
        both ways with another value is the caller's mistake, said so."""
        merged = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        for name, value in given.items():
            if value is None:
                continue
            if merged.get(name) is not None and merged[name] != value:
                raise TypeError(f"{name} is given both by .options() ({merged[name]!r}) and by the call ({value!r})")
            merged[name] = value
        return merged


class Workflow(Generic[R, P]):
    def __init__(
        self,
        func: Callable[..., Awaitable[R]],  # its parameters are bound to P by @workflow
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
        search_attributes: Sequence[str] = (),
        debounce: Debounce | None = None,
        batch: Batch | None = None,
        versioning: Versioning = "auto_upgrade",
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
        # the published keys also indexed for Client.list(where=...) (kenning/values.py)
        self.search_attributes = _search_attribute_keys(self.name, search_attributes)
        # flow control per key (kenning/flow.py): starts folded into bursts, events into batches
        self.debounce, self.batch = _flow_control(self.name, func, event_handler, debounce, batch)
        # which workers may run its instances: any (auto_upgrade), or its first claimer's version
        self.versioning: Versioning = _versioning(self.name, versioning)
        # what wf.options(...) gave: the starts of this copy use them
        self.start_options = StartOptions()
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

    def options(
        self,
        *,
        instance_id: str | None = None,
        idempotency_key: str | None = None,
        queue: str | None = None,
        partition_key: str | None = None,
        priority: int | None = None,
        on_parent_cancel: str | None = None,
        timeout: float | timedelta | None = None,
        search_attributes: Mapping[str, Any] | None = None,
        debounce: Debounce | None = None,
    ) -> Workflow[R, P]:
        """This workflow with start options, for the checked start calls:
        ``await client.start(order.options(instance_id="o-1"), order_id="o-1")``,
        ``await start_child(ctx, ship.options(instance_id=f"{ctx.instance_id}-ship"), parcel=1)``
        (``instance_id`` is then the child's id), ``await order.options(queue="q").start(...)``.
        The copy is the same workflow (its name, code and registry entry); options given
        again are added to these. ``timeout`` (seconds or a ``timedelta``) replaces the
        workflow's ``@workflow(timeout=...)`` for these starts. ``search_attributes`` sets
        declared search attributes with the instance's row (found by ``Client.list(where=...)``
        before it first runs), as a ``publish_value`` of each would."""
        configured = copy.copy(self)
        configured.start_options = StartOptions(
            **self.start_options.merged(
                instance_id=instance_id,
                idempotency_key=idempotency_key,
                queue=queue,
                partition_key=partition_key,
                priority=priority,
                on_parent_cancel=on_parent_cancel,
                timeout=_timeout_seconds(self.name, timeout),
                search_attributes=None if search_attributes is None else dict(search_attributes),
                debounce=debounce,
            )
        )
        return configured

    def named_arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """A start's arguments by name, as its input is stored: positional ones take the
        names of the parameters after the context, in order (a type checker accepts them,
        so a start does too). Raises ``TypeError`` if there are more than those names."""
        if not args:
            return kwargs
        parameters = list(inspect.signature(self.func).parameters.values())[1:]
        names = [
            p.name
            for p in parameters
            if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        ]
        if len(args) > len(names):
            raise TypeError(
                f"workflow {self.name!r} takes {len(names)} positional argument(s) after its context, got {len(args)}"
            )
        named = dict(zip(names, args, strict=False))
        for name in named:
            if name in kwargs:
                raise TypeError(f"workflow {self.name!r} got two values for {name!r}")
        return {**named, **kwargs}

    @overload
    async def start(self, *args: P.args, **kwargs: P.kwargs) -> str: ...
    # The options mixed with the arguments (Edda's form): the arguments are then unchecked.
    # One overload per option, each requiring it, so a call with none is checked above.
    @overload
    async def start(self, *args: Any, instance_id: str | None, **kwargs: Any) -> str: ...
    @overload
    async def start(self, *args: Any, idempotency_key: str | None, **kwargs: Any) -> str: ...
    @overload
    async def start(self, *args: Any, lock_timeout_seconds: float | None, **kwargs: Any) -> str: ...
    @overload
    async def start(self, *args: Any, queue: str | None, **kwargs: Any) -> str: ...
    @overload
    async def start(self, *args: Any, partition_key: str | None, **kwargs: Any) -> str: ...
    @overload
    async def start(self, *args: Any, priority: int | None, **kwargs: Any) -> str: ...
    async def start(self, *args: Any, **kwargs: Any) -> str:
        """Start an instance through the default client (``KENNING_DATABASE_URL``, else the
        ``db_url`` of this process's ``App``) and return its id.

        Unlike Edda 0.1.0 this does not run the workflow in the caller: a worker process
        picks it up. ``lock_timeout_seconds`` is accepted for Edda compatibility; leases are
        set by the worker (``--lease-seconds``).
        """
        from kenning.client import default_client

        kwargs.pop("lock_timeout_seconds", None)
        client = default_client()
        started: StartedInstance[R] = await client.start(self, *args, **kwargs)
        return started.instance_id

    def __repr__(self) -> str:
        return f"<workflow {self.name}>"


async def close_default_client() -> None:
    """Close the client ``Workflow.start`` opened in this event loop (``App.shutdown``)."""
    from kenning.client import close_default_client

    await close_default_client()


async def continue_as_new(ctx: WorkflowContext, /, **new_input: Any) -> NoReturn:
    """End this run of the workflow and start the next one of the same instance (same
    id, run number + 1) with ``new_input`` and a fresh history, atomically (Temporal's
    ``continue_as_new``)::

        @workflow
        async def loop(ctx: WorkflowContext, total: int = 0) -> int:
            for _ in range(1000):
                message = await receive(ctx, "work")
                total += await handle(ctx, message.data)
            await continue_as_new(ctx, total=total)  # never returns

    Messages and events sent to the instance meanwhile are kept for the next run. The
    input is checked as a start's is (``InvalidInputError``); a cancel requested before
    it wins. Not inside an activity or compensation (``RuntimeError``)."""
    await ctx.runtime.continue_as_new(new_input)


class WorkflowDecorator(Protocol):
    @overload
    def __call__(self, func: Callable[Concatenate[WorkflowContext, P2], Awaitable[R2]], /) -> Workflow[R2, P2]: ...
    @overload
    def __call__(self, func: Callable[..., Awaitable[R2]], /) -> Workflow[R2]: ...


@overload
def workflow(func: Callable[Concatenate[WorkflowContext, P2], Awaitable[R2]], /) -> Workflow[R2, P2]: ...
# a signature a checker cannot split into the context and P (mypy: ``(ctx, **kwargs)``, whose
# ctx could be given by name): a workflow of unchecked parameters, as before they were typed
@overload
def workflow(func: Callable[..., Awaitable[R2]], /) -> Workflow[R2]: ...
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
    search_attributes: Sequence[str] = (),
    debounce: Debounce | None = None,
    batch: Batch | None = None,
    versioning: Versioning = "auto_upgrade",
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
    search_attributes: Sequence[str] = (),
    debounce: Debounce | None = None,
    batch: Batch | None = None,
    versioning: Versioning = "auto_upgrade",
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
    ``WorkflowTimeoutError``; ``wf.options(timeout=...)`` sets another for one start.
    With ``search_attributes=("customer",)`` a ``publish_value(ctx, "customer", ...)`` also
    indexes the value, so ``Client.list(where={"customer": ...})`` finds the instance.
    With ``debounce=Debounce(key="document_id", period=5)`` starts of one key in a burst are
    one instance; with ``event_handler=True, batch=Batch(max_size=100, max_wait=2)`` its
    events start one instance per batch, their data its ``events`` list (kenning/flow.py).
    With ``versioning="pinned"`` an instance runs only on workers of the code version it
    started on (the first worker to claim it, or its pinned parent's), so a deploy never
    replays it on new code; ``"auto_upgrade"`` (the default) lets any worker run it.
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
            search_attributes=search_attributes,
            debounce=debounce,
            batch=batch,
            versioning=versioning,
        )
        REGISTRY.add_workflow(wf)
        return wf

    # wrap is WorkflowDecorator, which mypy cannot infer from its body
    return wrap(func) if func is not None else cast(WorkflowDecorator, wrap)


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


def _versioning(workflow_name: str, versioning: object) -> Versioning:
    if versioning not in VERSIONINGS:
        raise ConfigurationError(
            f"workflow {workflow_name!r}: versioning= must be one of {', '.join(map(repr, VERSIONINGS))}, "
            f"not {versioning!r}"
        )
    return cast(Versioning, versioning)


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


def _search_attribute_keys(workflow_name: str, keys: Sequence[str]) -> frozenset[str]:
    if isinstance(keys, str):
        raise ConfigurationError(f"workflow {workflow_name!r}: search_attributes= takes a tuple of keys, not a str")
    for key in keys:
        if not isinstance(key, str) or not key or len(key) > MAX_VALUE_KEY_LENGTH or key == STATUS_VALUE_KEY:
            raise ConfigurationError(
                f"workflow {workflow_name!r}: search attribute {key!r} must be a non-empty str of at most "
                f"{MAX_VALUE_KEY_LENGTH} characters, not {STATUS_VALUE_KEY!r}"
            )
    return frozenset(keys)


def _flow_control(
    workflow_name: str,
    func: Callable[..., Any],
    event_handler: bool,
    debounce: Debounce | None,
    batch: Batch | None,
) -> tuple[Debounce | None, Batch | None]:
    from kenning.flow import BATCH_PARAMETER

    if batch is None:
        return debounce, None
    if debounce is not None:
        raise ConfigurationError(f"workflow {workflow_name!r}: debounce= and batch= do not go together")
    if not event_handler:
        raise ConfigurationError(f"workflow {workflow_name!r}: batch= needs event_handler=True")
    if BATCH_PARAMETER not in inspect.signature(func).parameters:
        raise ConfigurationError(
            f"workflow {workflow_name!r}: batch= needs a parameter {BATCH_PARAMETER!r} (the list of its events' data)"
        )
    return None, batch
