"""``Worker``: claims runnable instances in batches, runs each under a lease.

One claim statement takes many instances (``FOR UPDATE SKIP LOCKED``), expired leases
included; a heartbeat extends the leases of everything in flight and cancels the runs
whose lease was taken over. Wakes on ``NOTIFY``, polls as a fallback.

Takeovers and crash loops: an instance whose previous run did not end cleanly (its lease
expired) is taken over by the plain claim, all of a dead worker's instances at once. One
whose earlier run died so too is a *suspect*: a worker runs at most one suspect at a time,
until it records a step, its run ends, or it has run a whole lease without taking its
worker down (a hung activity must not hold up the others' recovery), so an instance that
kills its process takes no other suspect down with it; the claim parks an instance after
``max_runs`` such runs in a row (``crashloop.py``).

Shutdown is bounded: in-flight runs get the grace period (counted from ``stop()``), then
are cancelled and release their leases; a run that ignores its cancellation is released
here and counted in ``abandoned``, for the process to exit without waiting on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import structlog

from kenning import codecs
from kenning.app import App
from kenning.core.names import CHANNEL_INBOX, CHANNEL_INSTANCES, CHANNEL_QUEUES, CHANNEL_SUBSCRIPTIONS
from kenning.core.records import ClaimedInstance, CompensationRecord, HistoryRecord
from kenning.db import Database
from kenning.db.bounds import SessionBounds
from kenning.db.errors import may_be_one_callers_fault
from kenning.db.groupcommit import GroupCommit
from kenning.engine.outcomes import RunOutcome
from kenning.engine.run import WorkflowRun
from kenning.errors import (
    ConfigurationError,
    ControlSignal,
    LeaseLostError,
    ObjectStoreError,
    ObjectStoreUnavailable,
    StorageUnavailable,
)
from kenning.hosting.config import ServiceSettings, positive_float, positive_int, process_id, setting, settings_group
from kenning.hosting.passloop import PassLoop, listening
from kenning.hosting.presence import Presence, code_version
from kenning.objects import Offloader, payloads, restored
from kenning.objects.offload import has_references
from kenning.observability import metrics, tracing
from kenning.observability.faults import fault_point
from kenning.storage import claims as claims_sql
from kenning.storage import history as history_sql
from kenning.storage import instances as instances_sql
from kenning.storage import writes as writes_sql
from kenning.storage.claims import DEFAULT_MAX_RUNS
from kenning.storage.writes import InstanceWrite
from kenning_worker.crashloop import report_parked
from kenning_worker.inbox import InboxProcessor, InboxSettings
from kenning_worker.port import PgInstancePort
from kenning_worker.queues import ClaimArgs, QueuePass, WorkerQueues
from kenning_worker.unknown import UnknownWorkflows

_log = structlog.get_logger("kenning.worker")

# After the grace period: how long cancelled runs get to release their leases, and how
# long the worker then spends releasing those of runs that ignored the cancellation.
CANCEL_SECONDS = 2.0
RELEASE_SECONDS = 2.0
# an instance whose payload this worker cannot open (a key missing) is offered again after this
UNREADABLE_RELEASE_SECONDS = 5.0


CODE_VERSION_MAX_LENGTH = 128  # a release name, a git SHA, an image digest ("sha256:" and 64 hex digits)


def check_code_version(text: str) -> str:
    """``text`` if it can be a worker's explicit code version, else a ``ValueError`` saying
    why. Non-empty (an unset ``$BUILD_ID`` in a deploy script must not fall back to the
    fingerprint unnoticed), bounded, printable and without whitespace: it is shown in
    one-line reports (``kenning why``, ``kenning workers list``) and compared exactly."""
    if not text:
        raise ValueError("must not be empty (leave it unset for the fingerprint of the workflows' code)")
    if len(text) > CODE_VERSION_MAX_LENGTH:
        raise ValueError(f"must be at most {CODE_VERSION_MAX_LENGTH} characters, got {len(text)}")
    if not text.isprintable() or any(char.isspace() for char in text):
        raise ValueError("must be printable characters without spaces")
    return text


@dataclass(frozen=True, kw_only=True)
class WorkerSettings(ServiceSettings):
    """``kenning worker``'s options (``kenning.hosting.config``)."""

    PROCESS: ClassVar[str] = "worker"

    app: str = setting("", help="modules defining workflows: module[:attribute][,module...]")
    concurrency: int = setting(32, type=positive_int, help="instances run at once")
    lease_seconds: float = setting(30.0, type=positive_float, per_process=True, help="lease on a claimed instance")
    pool_size: int = setting(
        10, type=positive_int, help="database connections per worker; instances in flight share them"
    )
    inline_retry_seconds: float = setting(
        5.0, type=float, help="retry back-offs up to this long wait in the worker; longer ones free it"
    )
    shutdown_grace_seconds: float = setting(
        30.0,
        type=float,
        per_process=True,
        help="on SIGTERM, time for instances in flight to finish before they are released",
    )
    # per attempt, for activities without @activity(timeout=)
    activity_timeout: float | None = setting(
        None,
        type=positive_float,
        help="seconds an activity attempt may run when it sets no @activity(timeout=); none by default",
    )
    # runs in a row without a clean end or a step: then crash_loop
    max_runs: int = setting(
        DEFAULT_MAX_RUNS,
        type=positive_int,
        help="runs in a row that may die without a step before the instance fails as crash_loop",
    )
    worker_id: str = setting("", help="name in leases and logs (default host-pid-random)")
    # the version instances of pinned workflows are pinned to (docs/operations.md#version-pinning);
    # checked once parsed (__post_init__), so a bad flag is one line, not argparse's usage too
    code_version: str | None = setting(
        None,
        type=str,
        help="this worker's code version, e.g. the build or release id (at most "
        f"{CODE_VERSION_MAX_LENGTH} printable characters, no spaces); default: a fingerprint of its workflows' "
        "names and source",
    )
    # its flags are --inbox-*; a field specifier, as dataclasses.field is
    inbox: InboxSettings = settings_group(InboxSettings)  # noqa: RUF009

    def __post_init__(self) -> None:
        if self.code_version is not None:  # the CLI prints a ConfigurationError as one line, exit 2
            try:
                check_code_version(self.code_version)
            except ValueError as error:
                shown = self.code_version[:40] + "..." if len(self.code_version) > 40 else self.code_version
                raise ConfigurationError(
                    f"--code-version / KENNING_CODE_VERSION {shown!r} is invalid: {error}"
                ) from None

    def database_bounds(self) -> SessionBounds:
        """The shared bounds, the idle-in-transaction one at most half the lease: a session
        cut off mid-transaction then frees its instances' rows before the lease its last
        heartbeat (every third of a lease) renewed expires, so they are taken over within a
        lease and a poll interval whatever ``--lease-seconds`` is. 0 (off) stays off."""
        bounds = super().database_bounds()
        cap = self.lease_seconds / 2
        if 0 < cap < bounds.idle_in_transaction:
            return dataclasses.replace(bounds, idle_in_transaction=cap)
        return bounds


@dataclass
class ClaimPacer:
    """The least time between two claims of one worker, after a wake-up.

    A claim that found work keeps the spacing short (``base``: wake-ups arriving within
    it share one claim); each claim that found nothing doubles it, up to ``ceiling``, so
    a worker that keeps losing the race for freshly started instances claims less often.
    The spacing counts from the last claim: a worker idle for longer claims at once, so
    a lone event or timer after a quiet spell is not delayed.
    """

    base: float = 0.005
    ceiling: float = 0.04
    last_claim_at: float = float("-inf")
    spacing: float = field(init=False)

    def __post_init__(self) -> None:
        self.spacing = self.base

    def claimed(self, now: float, *, found: bool) -> None:
        self.spacing = self.base if found else min(self.spacing * 2, self.ceiling)
        self.last_claim_at = now

    def delay(self, now: float) -> float:
        return max(0.0, self.last_claim_at + self.spacing - now)


async def restored_history(history: list[HistoryRecord]) -> list[HistoryRecord]:
    """The records with the values their payloads reference read back from the object
    store (``kenning.objects``); records without a reference are kept as they are."""
    out = []
    for record in history:
        if has_references(record.payload):
            record = dataclasses.replace(record, payload=await restored(record.payload))
        out.append(record)
    return out


class Worker:
    def __init__(self, database: Database, app: App, settings: WorkerSettings | None = None) -> None:
        self.database = database
        self.app = app
        self.settings = settings or WorkerSettings()
        self.worker_id = self.settings.worker_id or process_id()
        self.offloader = Offloader.configured(self.settings.object_store, self.settings.offload_bytes)
        # every payload this process seals goes through the boundary's offload (kenning.objects.payloads)
        payloads.configure(self.settings.object_store, self.settings.offload_bytes)
        self.workflow_names = sorted(app.registry.workflows)
        # its code version (the one set, else the fingerprint of its workflows: one version for
        # the whole worker), and the workflows whose instances it pins to it at their first
        # claim (docs/operations.md#version-pinning)
        self.code_fingerprint = code_version({name: wf.source_hash for name, wf in app.registry.workflows.items()})
        self.code_version = self.settings.code_version or self.code_fingerprint
        self.pinned = sorted(name for name, wf in app.registry.workflows.items() if wf.versioning == "pinned")
        self._running: dict[str, asyncio.Task[None]] = {}  # lease token -> run
        self._claimed: dict[str, ClaimedInstance] = {}  # lease token -> what was claimed
        # The lease token of the suspect in flight (earlier runs died without a step), if
        # any, and when it was claimed (the loop's clock): until it records a step, ends,
        # or outlives a lease, the claim takes no other suspect.
        self._suspect: str | None = None
        self._suspect_since = 0.0
        # crash loops being reported (log line and failure hook), apart from the claim loop
        self._reports: set[asyncio.Task[None]] = set()
        self._drain_deadline: float | None = None
        self.abandoned = 0  # runs that outlived their cancellation at shutdown
        self._wake = asyncio.Event()  # another claim pass, now (set by the runs' ends too)
        # Whether another claim may find work: set by NOTIFY and polls, and after a claim
        # that filled every free slot; a finished run frees a slot but brings no new work.
        self._work_likely = True
        # Claims are batched: the NOTIFYs of many starts and the ends of many runs coalesce
        # into one claim of every free slot. Saturated (the last claim filled every slot),
        # it refills a quarter of its slots at a time. Claims are spaced (``ClaimPacer``):
        # several workers woken by one NOTIFY race for one row, and the losers back off
        # instead of paying a commit per start each.
        self._pacer = ClaimPacer()
        self._refill_at = max(1, self.settings.concurrency // 4)
        self._saturated = False
        # when the last claim said the next instance comes due (the loop's clock; inf: a poll)
        self._due_at = math.inf
        self.log = _log.bind(worker_id=self.worker_id)
        self.loop = PassLoop(
            self._claim_pass,
            log=self.log,
            failed_event="worker.claim_failed",
            retry_seconds=min(self.settings.poll_interval, 1.0),
            settle=self._claim_spacing,  # let more wake-ups arrive: one claim for all
            on_poll=self._polled,
            wake=self._wake,
        )
        # Group commit of the instances' step records and completions: the writes of
        # instances running side by side share one statement and one commit.
        self.writes: GroupCommit[InstanceWrite, bool | None] = GroupCommit(
            write=self._apply_writes,
            retry_alone=may_be_one_callers_fault,
            max_items=self.settings.concurrency,
            name="worker_steps",
        )
        self.inbox = InboxProcessor(
            database,
            app,
            self.settings.inbox,
            worker_id=self.worker_id,
            poll_interval=self.settings.poll_interval,
            lease_seconds=self.settings.lease_seconds,
        )
        # at start and when a claim finds nothing, at most every tenth poll: soon enough for
        # an operator looking at a stuck start, and never on a busy worker's hot path
        self.unknown = UnknownWorkflows(database, app, interval=self.settings.poll_interval * 10, log=self.log)
        # the queues it claims from under their limits (kenning_worker/queues.py)
        self.queues = WorkerQueues(database, app, log=self.log)
        self._queued: set[str] = set()  # lease tokens of queued instances in flight
        # its entry in the fleet's registry, under the name its leases carry (`kenning why`)
        self.presence = Presence(
            database,
            kind="worker",
            process_id=self.worker_id,
            interval=self.settings.presence_interval,
            commit_stall_seconds=self.settings.commit_stall_seconds,
            details=self.presence_details,
        )

    def presence_details(self) -> dict[str, Any]:
        """What it says of itself in the fleet's registry (``kenning workers list``): its
        workflows and queues, how many instances it may run and runs now."""
        return {
            "workflows": self.workflow_names,
            "queues": self.queues.names,
            "concurrency": self.settings.concurrency,
            "running": len(self._running),
            "inbox": self.settings.inbox.enabled,
            "app": self.settings.app,
            "code_version": self.code_version,
            # beside a version set by hand: two workers of one version with different code show it
            "code_fingerprint": self.code_fingerprint,
        }

    def stop(self) -> None:
        """Stop claiming; in-flight runs get the grace period to finish (SIGTERM)."""
        if self._drain_deadline is None:
            self._drain_deadline = asyncio.get_running_loop().time() + self.settings.shutdown_grace_seconds
        self.loop.stop()
        self.inbox.stop()

    def _notify(self, channel: str) -> None:
        if channel in (CHANNEL_INBOX, CHANNEL_SUBSCRIPTIONS):
            self.inbox.wake()
        else:
            if channel == CHANNEL_QUEUES:
                # a start into a queue it may not know yet: read them before the next claim,
                # or the instance waits for a poll
                self.queues.stale = True
            self._work_likely = True
            self.loop.wake()

    async def run(self) -> None:
        if not self.workflow_names:
            self.log.warning("worker.no_workflows", hint="--app must name the modules that define workflows")
        channels = [CHANNEL_INSTANCES, CHANNEL_QUEUES]
        if self.settings.inbox.enabled:
            channels += [CHANNEL_INBOX, CHANNEL_SUBSCRIPTIONS]
        try:
            async with (
                self.presence.running(),
                listening(
                    self.database.listen_url,
                    channels,
                    self._notify,
                    enabled=self.settings.listen,
                    parameters=self.database.client_parameters,
                ),
            ):
                await self._claiming()
        finally:
            self.log.info("worker.stopped")

    async def _check_object_store(self) -> None:
        """A store that does not answer is said at start, in one line naming what to fix;
        the worker runs on (a value that needs the store waits for it, nothing is lost)."""
        try:
            await self.offloader.check()
        except ObjectStoreError as error:
            self.log.error("worker.object_store_unavailable", error=str(error))

    async def _claiming(self) -> None:
        await self.unknown.register()  # before worker.started: its workflows may be started by name
        await self.queues.declare()  # and its queues' limits hold before its first claim
        heartbeat = asyncio.create_task(self._heartbeat_loop(), name="kenning-heartbeat")
        unknown = asyncio.create_task(self.unknown.run(), name="kenning-unknown-workflows")
        inbox = asyncio.create_task(self.inbox.run(), name="kenning-inbox") if self.settings.inbox.enabled else None
        await self._check_object_store()
        self.log.info(
            "worker.started",
            workflows=self.workflow_names,
            concurrency=self.settings.concurrency,
            code_version=self.code_version,
            code_fingerprint=self.code_fingerprint,
            pinned=self.pinned,
        )
        try:
            await self.loop.run()
        finally:
            self.inbox.stop()
            if inbox is not None:
                await inbox  # it finishes the row in hand and gives the rest back
            await self._drain()
            await self._finish_reports()
            for task in (heartbeat, unknown):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _claim_pass(self) -> float:
        """Claim every free slot when work is likely; returns the seconds until the next
        pass (the poll interval, or sooner when a queued instance comes due)."""
        free = self.settings.concurrency - len(self._running)
        poll = self.settings.poll_interval
        now = asyncio.get_running_loop().time()
        if self._due_at <= now:  # the run-after time the last claim saw has come
            self._work_likely, self._due_at = True, math.inf
        wanted = self._work_likely and free > 0 and (not self._saturated or free >= self._refill_at)
        if not self.workflow_names:
            self.unknown.idle()  # it claims nothing: idle whenever it polls
        if not (wanted and self.workflow_names):
            # a pass woken by a run's end keeps the wake-up the last claim asked for
            return min(poll, self._due_at - now)
        self._work_likely = False
        try:
            claimed, until = await self._claim(free)
        except Exception:  # the loop logs it (worker.claim_failed) and retries
            self._work_likely, self._saturated = True, False
            raise
        # a claim that found nothing due yet lost no race: the spacing stays short, so a
        # wake-up meanwhile (another burst's NOTIFY) settles briefly (kenning/flow.py)
        self._pacer.claimed(asyncio.get_running_loop().time(), found=claimed > 0 or (until or 0.0) > 0)
        sleep_for = poll
        if claimed == 0:
            self.unknown.idle()
        if claimed == 0 and until is not None and until <= 0 and self._suspect is not None:
            # due but not claimed may be a suspect this worker leaves to others while it
            # runs one: no spinning on it; the end of its own suspect, or a NOTIFY, wakes it
            sleep_for = poll
        elif until is not None and claimed < free:
            # due but not claimed means another worker holds it: back off as after any
            # lost race instead of spinning on it; else wake when the next comes due (a
            # debounced burst's quiet period ending: kenning/flow.py), not a poll later,
            # nor a claim spacing later (empty claims, as a burst's moving due time makes,
            # stretch the spacing)
            sleep_for = min(poll, until if until > 0 else self._pacer.spacing)
        self._saturated = claimed == free
        if self._saturated:
            self._work_likely = True
        self._due_at = now + sleep_for if sleep_for < poll else math.inf
        return sleep_for

    def _polled(self) -> None:
        """A pass came due with no wake-up (a poll, or the next run-after time)."""
        self._work_likely, self._saturated = True, False
        self.queues.stale = True  # queues created since (a start into a new one) are served

    def _claim_spacing(self) -> float:
        return self._pacer.delay(asyncio.get_running_loop().time())

    async def _claim(self, limit: int) -> tuple[int, float | None]:
        """Claim and start up to ``limit`` instances; returns how many, and when nothing
        was claimable, the seconds until something will be (None: nothing is queued)."""
        # Autocommit: each claim is one statement (its own transaction), the loads are reads.
        # The plain claim and each queue's take turns going first (kenning_worker/queues.py).
        # Large values stay references here: each run reads its own back (_execute), apart
        # from the claim loop and without blocking it.
        with payloads.deferred():
            return await self._claim_deferred(limit)

    async def _claim_deferred(self, limit: int) -> tuple[int, float | None]:
        async with self.database.connection() as conn:
            await self.queues.refresh(conn, self.workflow_names)
            queued = QueuePass()
            until: float | None = None
            remaining, take_suspect = limit, self._suspect is None
            for source in self.queues.order():
                if remaining <= 0:
                    break
                asked = ClaimArgs(
                    owner=self.worker_id,
                    workflow_names=self.workflow_names,
                    limit=remaining,
                    lease_seconds=self.settings.lease_seconds,
                    max_runs=self.settings.max_runs,
                    take_suspect=take_suspect,
                    code_version=self.code_version,
                    pinned=self.pinned,
                )
                if source is None:
                    started = time.perf_counter()
                    claim = await claims_sql.instance_claim(conn, **asked)
                    metrics.CLAIM_DURATION.observe(time.perf_counter() - started)
                    queued.claims.append(claim)
                    until = claim.seconds_until_next
                else:
                    claim = await self.queues.claim(conn, source, asked, into=queued)
                remaining -= len(claim.instances) + len(claim.parked)
                take_suspect = take_suspect and not any(c.suspect for c in claim.instances)
            claimed = [c for one in queued.claims for c in one.instances]
            parked = [p for one in queued.claims for p in one.parked]
            if not claimed and queued.seconds_until_next is not None:
                until = queued.seconds_until_next if until is None else min(until, queued.seconds_until_next)
            # Fresh instances have no history: skip the load for them.
            resumed = [c.id for c in claimed if c.run_count > 1 or c.status == "compensating"]
            histories = await history_sql.history_load(conn, resumed)
            compensating = [c.id for c in claimed if c.status == "compensating" or c.cancel_requested]
            compensations = await history_sql.compensations_load(conn, compensating)
        for instance in claimed:
            self.log.debug(
                "instance.claimed", instance_id=instance.id, workflow=instance.workflow_name, suspect=instance.suspect
            )
            metrics.CLAIMED.labels(instance.workflow_name).inc()
            if instance.taken_over:
                metrics.LEASE_TAKEOVERS.labels(instance.workflow_name).inc()
            if instance.suspect:
                self._suspect, self._suspect_since = instance.lease_token, asyncio.get_running_loop().time()
            self._claimed[instance.lease_token] = instance
            if instance.lease_token in queued.tokens:
                self._queued.add(instance.lease_token)
            task = asyncio.create_task(
                self._execute(instance, histories.get(instance.id, []), compensations.get(instance.id, [])),
                name=f"kenning-instance-{instance.id}",
            )
            self._running[instance.lease_token] = task
        if parked:
            self._work_likely = True  # they took slots of this claim that others may fill
            self.loop.wake()
            # after the runs started (their leases renewed by the heartbeat from now on),
            # and apart from the claim loop: the failure hook may take any time
            report = asyncio.create_task(
                report_parked(self.app, self.log, parked, max_runs=self.settings.max_runs),
                name="kenning-crash-loop-report",
            )
            self._reports.add(report)
            report.add_done_callback(self._reports.discard)
        return len(claimed), until

    async def _execute(
        self, claimed: ClaimedInstance, history: list[HistoryRecord], compensations: list[CompensationRecord]
    ) -> None:
        log = self.log.bind(instance_id=claimed.id, workflow=claimed.workflow_name)
        started, ended = time.perf_counter(), "released"
        trace = tracing.RunTrace(claimed.id, claimed.workflow_name, claimed.run_count, claimed.trace_context)
        # this task's own context: what the run stores belongs to the instance, and a store
        # that fails ends the run, compensating nothing
        payloads.enter_run(claimed.id)
        try:
            # the large values its rows reference, fetched before the replay reads them
            history = await restored_history(history)
            if has_references(claimed.input):
                claimed = dataclasses.replace(claimed, input=codecs.unseal(await restored(claimed.input)))
            run = WorkflowRun(
                app=self.app,
                workflow=self.app.registry.workflow(claimed.workflow_name),
                claimed=claimed,
                history=history,
                compensations=compensations,
                port=PgInstancePort(database=self.database, claimed=claimed, writes=self.writes),
                inline_retry_seconds=self.settings.inline_retry_seconds,
                activity_timeout=self.settings.activity_timeout,
            )
            outcome = await run.run()
            while outcome is RunOutcome.CONTINUED and run.continued_input is not None:
                # continue_as_new kept the lease: run N+1 goes on here at once, its history empty
                if self._drain_deadline is not None:  # stopping: another worker takes it on
                    await self._release(claimed, log)
                    break
                claimed = dataclasses.replace(
                    claimed, input=run.continued_input, attempts={}, run_count=claimed.run_count + 1
                )
                run = WorkflowRun(
                    app=self.app,
                    workflow=run.workflow,
                    claimed=claimed,
                    history=[],
                    compensations=[],
                    port=PgInstancePort(database=self.database, claimed=claimed, writes=self.writes),
                    inline_retry_seconds=self.settings.inline_retry_seconds,
                    activity_timeout=self.settings.activity_timeout,
                )
                outcome = await run.run()
            ended = outcome.value
            log.debug("instance.run_ended", outcome=outcome.value)
        except asyncio.CancelledError:
            await self._release(claimed, log)
        except (ObjectStoreUnavailable, ObjectStoreError) as error:
            ended = "storage_unavailable"
            log.error("instance.object_store_unavailable", error=str(error))
            await self._release(claimed, log, delay=5.0)
        except StorageUnavailable as error:
            ended = "storage_unavailable"
            log.warning("instance.storage_unavailable", error=repr(error.__cause__))
            await self._release(claimed, log, delay=1.0)  # may fail too: then the lease expires
        except LeaseLostError:  # run() answers LEASE_LOST itself; never let one end the task unseen
            ended = "lease_lost"
            log.warning("instance.lease_lost")
        except codecs.CodecError as error:
            # a payload sealed under a key this worker lacks: its configuration, not the
            # workflow's fault; nothing was written, nothing is failed or compensated, and the
            # run is not counted toward crash-loop parking: another worker (or this one, given
            # the key) takes it up after the delay
            ended = "payload_unreadable"
            log.error(
                "instance.payload_unreadable",
                error=str(error),
                hint="released, not failed: give this worker the key in KENNING_ENCRYPTION_KEYS",
            )
            await self._release(claimed, log, delay=UNREADABLE_RELEASE_SECONDS)
        except (Exception, ControlSignal) as error:  # a signal no handler took is an engine bug
            ended = "crashed"
            log.exception("instance.run_crashed", error=repr(error))
            # counted as a run without progress, as if its lease had expired: one that
            # raises the same way every time is parked after --max-runs runs
            await self._release(claimed, log, delay=1.0, crashed=True)
        finally:
            trace.close(ended)
            metrics.WORKFLOW_RUN_DURATION.labels(claimed.workflow_name, ended).observe(time.perf_counter() - started)
            self._running.pop(claimed.lease_token, None)
            self._claimed.pop(claimed.lease_token, None)
            if claimed.lease_token in self._queued:
                # its queue's slot is free: the backlog a limit held back may be claimable
                self._queued.discard(claimed.lease_token)
                self._work_likely = True
            if self._suspect == claimed.lease_token:
                self._cleared_suspect()
            self._wake.set()

    def _cleared_suspect(self) -> None:
        """The suspect in flight ended or made progress: another may be claimed."""
        self._suspect = None
        self._work_likely = True
        self._wake.set()

    async def _apply_writes(self, writes: Sequence[InstanceWrite]) -> list[bool | None]:
        async with self.database.connection() as conn:
            flags = await writes_sql.writes_apply(conn, writes)
        suspect = self._suspect
        if suspect is not None and any(
            w.token == suspect and w.steps and flag is not None for w, flag in zip(writes, flags, strict=True)
        ):
            self._cleared_suspect()  # it recorded a step: whatever kills workers, it is not stuck on it
        return flags

    async def _release(self, claimed: ClaimedInstance, log: Any, delay: float = 0.0, *, crashed: bool = False) -> None:
        """Hand the instance back (shutdown or crash) so another worker need not wait for
        the lease to expire; a lease already lost makes this a no-op. A crashed run is
        handed back as an expired lease, which the next claim counts (``crashloop.py``)."""
        fault_point("instance.before_release")
        try:
            async with self.database.connection() as conn:  # one statement: its own transaction
                if crashed:
                    released = await instances_sql.instance_release_crashed(
                        conn, claimed.id, claimed.lease_token, delay
                    )
                else:
                    released = await instances_sql.instance_release(conn, claimed.id, claimed.lease_token, delay)
            if released:
                log.info("instance.released")
        except Exception as error:
            log.warning("instance.release_failed", error=repr(error))

    async def _heartbeat_loop(self) -> None:
        interval = self.settings.lease_seconds / 3
        while True:
            await asyncio.sleep(interval)
            tokens = list(self._running)
            if not tokens:
                continue
            try:
                async with self.database.connection() as conn:  # one statement: its own transaction
                    lost = await instances_sql.instance_heartbeat(conn, tokens, self.settings.lease_seconds)
            except Exception as error:
                self.log.warning("worker.heartbeat_failed", error=repr(error))
                continue
            for token in lost:
                task = self._running.get(token)
                if task is not None:
                    self.log.warning("instance.lease_lost", lease_token=token)
                    metrics.LEASES_LOST.inc()
                    task.cancel()
            await self._check_suspect()

    async def _check_suspect(self) -> None:
        """Clear the suspect in flight once it recorded a step since its claim, or once it
        has run for a whole lease. Steps written through the group commit clear it at once
        (``_apply_writes``); those an activity records in its own transaction (ctx.session,
        outbox) are seen here, by the claim's own test of progress, within a heartbeat.

        A suspect still running after a lease has not taken its worker down the way the
        runs that made it a suspect did: isolating it longer would let one hung activity
        (no timeout, the default) hold up every other suspect's recovery for ever."""
        suspect = self._suspect
        if suspect is None or suspect not in self._running:
            return
        if asyncio.get_running_loop().time() - self._suspect_since >= self.settings.lease_seconds:
            claimed = self._claimed.get(suspect)
            self.log.info(
                "instance.suspect_cleared",
                instance_id=None if claimed is None else claimed.id,
                workflow=None if claimed is None else claimed.workflow_name,
                reason="ran a whole lease without taking its worker down",
            )
            self._cleared_suspect()
            return
        try:
            async with self.database.connection() as conn:
                progressed = await instances_sql.instance_progressed(conn, suspect)
        except Exception as error:
            self.log.debug("worker.suspect_check_failed", error=repr(error))
            return
        if progressed and self._suspect == suspect:
            self._cleared_suspect()

    async def _finish_reports(self) -> None:
        """Crash-loop reports still running at shutdown get a bounded wait (their hooks)."""
        if not self._reports:
            return
        _, late = await asyncio.wait(set(self._reports), timeout=CANCEL_SECONDS)
        for task in late:
            task.cancel()

    async def _drain(self) -> None:
        """Give in-flight runs what is left of the grace period, then cancel them (each
        releases its lease) and release the leases of those that ignore it: the worker's
        part of the bound on exit after SIGTERM."""
        if not self._running:
            return
        tasks = list(self._running.values())
        self.log.info("worker.draining", in_flight=len(tasks), grace=self.settings.shutdown_grace_seconds)
        loop = asyncio.get_running_loop()
        deadline = self._drain_deadline or loop.time() + self.settings.shutdown_grace_seconds
        _, still_running = await asyncio.wait(tasks, timeout=max(0.0, deadline - loop.time()))
        if not still_running:
            return
        for task in still_running:
            task.cancel()
        _, stuck = await asyncio.wait(still_running, timeout=CANCEL_SECONDS)
        if not stuck:
            return
        self.abandoned = len(stuck)
        self.log.warning("worker.runs_abandoned", count=len(stuck), hint="a run ignored its cancellation")
        abandoned = [self._claimed[t] for t, task in self._running.items() if task in stuck and t in self._claimed]
        releases = [self._release(c, self.log.bind(instance_id=c.id, workflow=c.workflow_name)) for c in abandoned]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*releases), timeout=RELEASE_SECONDS)
