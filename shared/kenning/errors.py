"""Exceptions users see, with Edda 0.1.0's names and meanings."""

from __future__ import annotations


class KenningError(Exception):
    """Base class of the errors Kenning raises on its own account for callers to catch.

    Not of the engine's control signals (``ControlSignal``: ``NonDeterminismError``,
    ``LeaseLostError``, ``Suspended``, ``StorageUnavailable``), which are
    ``BaseException``s so that no ``except Exception`` in user code can swallow them,
    nor of those kept as plain ``Exception``s with Edda's names and meanings
    (``TerminalError``, ``RetryExhaustedError``,
    ``WorkflowCancelledException``, ``EventTimeoutError``, ``ReplayedActivityError``).
    """


class TerminalError(Exception):
    """An activity error that must not be retried: recorded once and re-raised as is."""


class RetryExhaustedError(Exception):
    """An activity failed on every attempt its retry policy allowed.

    ``__cause__`` is the last error, also on replay.
    """


class WorkflowCancelledException(Exception):  # noqa: N818 - Edda's public name
    """Raised inside a workflow at the next step boundary after ``cancel()``."""


class EventTimeoutError(Exception):
    """``wait_event`` waited longer than its ``timeout_seconds``; the workflow may catch it."""


class ActivityTimeoutError(KenningError):
    """An activity attempt ran longer than its ``timeout``; counted as a failed attempt.

    The retry policy applies: retried, and once exhausted the workflow sees a
    ``RetryExhaustedError`` whose ``__cause__`` is this error (also on replay).
    """


class HeartbeatTimeoutError(ActivityTimeoutError):
    """An activity attempt declared ``@activity(heartbeat_timeout=...)`` and went that long
    without calling ``ctx.heartbeat``: cancelled (a sync one abandoned in its thread) and
    counted as a failed attempt, like any ``ActivityTimeoutError``. The next attempt reads
    the last details it heartbeated in ``ctx.heartbeat_details``."""


class UnstorableValueError(TerminalError, KenningError):
    """A value headed for the database that PostgreSQL cannot store (a NUL character,
    NaN, a lone surrogate): the step's failure, never retried and never replayed in a loop.
    Also a ``KenningError``: a client's caller catches it with the rest."""


class ControlSignal(BaseException):
    """Base of the engine's control signals: they end a run's workflow code and are
    handled by the engine alone.

    A ``BaseException`` (as ``asyncio.CancelledError`` is), so that ``except Exception``
    in workflow or activity code can never swallow one and carry on down a path the
    engine has already left.
    """


class NonDeterminismError(ControlSignal):
    """Replay asked for a different step than the one recorded in history.

    The instance ends ``failed`` without compensation (the code diverged from its
    history: nothing on the new path may run); a code fix and a new instance are needed.
    ``step_id`` is the first recorded step the code no longer reaches as recorded,
    ``recorded_name`` its recorded name and ``new_name`` what the code runs instead ("" when
    it returned): ``kenning replay-check`` reports them.
    """

    def __init__(self, message: str, *, step_id: str = "", recorded_name: str = "", new_name: str = "") -> None:
        super().__init__(message)
        self.step_id = step_id
        self.recorded_name = recorded_name
        self.new_name = new_name


class LeaseLostError(ControlSignal):
    """This worker's lease on an instance expired and another worker took it over.

    Raised by every fenced write that sees zero rows; the stale worker stops at once.
    """


class CancelSeenBeforeWrite(ControlSignal):
    """A write that carries the held-back step record found, in that record's fence, a
    cancel committed since the run's last write: the record is committed, the write's own
    rows are not. The engine ends the step as cancelled, as the check at every step
    boundary does after a flush (``WorkflowRun.folded``)."""


class Suspended(ControlSignal):
    """The instance gave its lease back: it waits for an event or a timer, or a retry
    back-off long enough to free the worker. The run ends; another claim resumes it."""


class ContinuedAsNew(ControlSignal):
    """``continue_as_new`` ended the run's workflow code: the engine ends this run and
    starts the next one of the same instance with ``input`` (JSON, checked) and a fresh
    history. A ``BaseException``: an ``except Exception`` in the workflow never stops it."""

    def __init__(self, input: dict[str, object]) -> None:
        super().__init__("continue as new")
        self.input = input


class StorageUnavailable(ControlSignal):
    """Kenning could not write an instance's progress because the database is away.

    Not the workflow's failure: the run ends, nothing is compensated, and the worker
    releases the instance to be replayed once the database answers.
    """


class ObjectStoreUnavailable(StorageUnavailable):
    """A worker could not write or read a large value in the object store (unreachable,
    a missing bucket, refused credentials, an object gone or altered).

    Handled as the database being away: the run ends, nothing is compensated, and the
    instance is replayed once the store answers; the message is one line naming what to fix.
    """


class ObjectStoreError(KenningError):
    """A client or command could not read a large value from the object store; the message
    is one line naming what to fix (the store, the bucket, the credentials, the object)."""


class ReplayedActivityError(Exception):
    """A recorded activity failure whose exception class cannot be rebuilt here.

    ``error_type`` keeps the dotted name of the original class.
    """

    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(f"{error_type}: {message}")
        self.error_type = error_type
        self.message = message


class WorkflowTimeoutError(KenningError):
    """An instance outlived its workflow timeout (``@workflow(timeout=...)``, or a start's
    ``wf.options(timeout=...)``): the scheduler requested its cancellation at the deadline,
    its compensations ran, and it ended ``failed`` with this error (not ``cancelled``).
    ``Client.result`` raises ``WorkflowFailedError`` naming it."""


class ConfigurationError(KenningError):
    """A setting, flag or workflow definition is invalid; the message names it."""


class MigrationBlockedError(KenningError):
    """A migration waited its lock timeout for a table another session holds, as many
    times as it may retry, and gave up (nothing of it committed); the message names the
    table and the session holding it."""


class DatabaseUnavailableError(KenningError):
    """A client's call could not reach the database (a restart, a failover, a lost
    connection, no free connection) even after the client's own retries of a call a retry
    cannot do twice. Nothing about the call's values: try again, the message says how
    (a ``message_id`` or ``request_id`` makes a resent message count once)."""


class WorkflowNotFoundError(KenningError):
    """No instance with that id exists."""


class MessageUndeliverableError(KenningError):
    """``send_message`` to an instance that ended: nothing would ever receive it. (One
    that does not exist is ``WorkflowNotFoundError``.)"""


class WorkflowFailedError(KenningError):
    """``Client.result`` of an instance that ended ``failed`` or ``cancelled``."""

    def __init__(self, instance_id: str, status: str, error: dict[str, object] | None) -> None:
        detail = ""
        if error:
            detail = f": {error.get('type')}: {error.get('message')}"
        super().__init__(f"instance {instance_id} ended {status}{detail}")
        self.instance_id = instance_id
        self.status = status
        self.error = error


class ChildWorkflowFailed(KenningError):  # noqa: N818 - Temporal's name (ChildWorkflowError) reads as a failure
    """``await handle.result()`` of a child workflow that ended ``failed`` or ``cancelled``:
    raised in the parent (whose compensations then apply unless it catches it), with the
    child's id, its status and its stored error (``type``, ``message``...)."""

    def __init__(self, child_id: str, status: str, error: dict[str, object] | None, workflow: str = "") -> None:
        # the arguments are the exception's args, so the parent's stored error rebuilds it
        super().__init__(child_id, status, error, workflow)
        self.child_id = child_id
        self.status = status
        self.error = error
        self.workflow = workflow

    def __str__(self) -> str:
        detail = f": {self.error.get('type')}: {self.error.get('message')}" if self.error else ""
        name = f" ({self.workflow})" if self.workflow else ""
        return f"child workflow {self.child_id}{name} ended {self.status}{detail}"


class ChildStartRefused(KenningError):  # noqa: N818
    """``start_child`` with an explicit ``child_id`` that an instance which is not this
    parent's child already has."""


class UsageError(KenningError):
    """What the operator asked for cannot be done as asked; the message says why and,
    where it can, what to type instead."""


class RequestError(KenningError):
    """``Client.request`` got no reply: the base of the request errors below, each naming
    the instance, the topic and the request id (its message id)."""

    def __init__(self, message: str, instance_id: str = "", topic: str = "", request_id: str = "") -> None:
        super().__init__(message, instance_id, topic, request_id)
        self.instance_id = instance_id
        self.topic = topic
        self.request_id = request_id

    def __str__(self) -> str:
        return str(self.args[0])


class RequestNotAnsweredError(RequestError):
    """The instance ended (``status``: completed, failed or cancelled) without replying to
    the request: raised as soon as its end commits, not at the timeout."""

    def __init__(
        self, message: str, instance_id: str = "", topic: str = "", request_id: str = "", status: str = ""
    ) -> None:
        super().__init__(message, instance_id, topic, request_id)
        self.args = (message, instance_id, topic, request_id, status)
        self.status = status


class RequestTimeoutError(RequestError, TimeoutError):
    """``Client.request(timeout=...)`` ran out before the reply: the request stays in the
    instance's mailbox, and a reply made later is still stored (a retry with the same
    ``request_id`` gets it)."""


class RequestRejectedError(RequestError):
    """The workflow answered the request with ``message.reply_error(ctx, reason)``:
    ``reason`` is its text."""

    def __init__(
        self, message: str, instance_id: str = "", topic: str = "", request_id: str = "", reason: str = ""
    ) -> None:
        super().__init__(message, instance_id, topic, request_id)
        self.args = (message, instance_id, topic, request_id, reason)
        self.reason = reason


class MessageAlreadyRepliedError(KenningError):
    """A workflow replied a second time to the same message: the first reply stands.
    Recorded as the failed step, raised again on replay."""


class ValueNotPublishedError(KenningError, LookupError):
    """``Client.get_value``: the instance has not published that key (by the end of the
    ``timeout`` when one was given, or it ended without publishing it)."""


class StreamClosedError(KenningError, TerminalError):
    """``write_stream`` to a stream that was closed (``close_stream``, or its instance
    ended): nothing was written. Not retried in an activity: a retry would find it closed."""


class StreamFullError(KenningError, TerminalError):
    """``write_stream`` to a stream holding ``kenning.core.limits.MAX_STREAM_ENTRIES``
    entries already: nothing was written; write on under another key."""
