"""Kenning's Prometheus metrics, every one defined here (docs/operations.md lists them).

Two kinds, by what they cost:

- events, counted in the process where they happen (a claim, a step's attempt, a run's
  end, a fired timer, a delivery, a request): a counter or histogram of
  ``prometheus_client``, an increment in memory on the hot path, nothing more;
- the state of the database (backlogs, the age of the oldest waiting row, instances by
  status): ``DatabaseGauges``, made at scrape time from the one statement of
  ``kenning.storage.metrics``, never per event.

Beside them one gauge every process sets of itself, ``COMMIT_STALL``: how long its commit
probe waits (``kenning.hosting.commitwatch``).

Each family names the processes that export it (``exported_by``): every process imports
this module, but a scrape of the worker carries the worker's families only, not 35 empty
ones of the others. The database gauges come from one kind of process,
``DATABASE_GAUGES_PROCESS`` (the scheduler): were every process to repeat them, a sum
over processes would multiply the backlog by the number of processes.

``kenning.hosting.scrape`` serves them at ``/metrics``. Label values are bounded by the
code (workflow, activity and route names, outcomes), never by data (no instance ids);
where a value comes from data (event types, workflow names in the database), the first
``MAX_LABEL_VALUES`` keep their own series and the rest count as ``other``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar, Final, TypeVar

from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:  # the storage layer is no import of the hot paths that count events
    from kenning.core.records import MetricsRow


# No ``*_created`` series beside each counter and histogram: the text format's scrapers
# do not use them, and they would double what a scrape carries.
disable_created_metrics()  # type: ignore[no-untyped-call]

# Seconds: a claim or a request is milliseconds; a step or a run may take minutes.
FAST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
SLOW_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
LATENESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)

# ---------------------------------------------------------------- who exports what

WORKER: Final = "worker"
SCHEDULER: Final = "scheduler"
RELAYER: Final = "relayer"
INGRESS: Final = "ingress"
CONSOLE: Final = "console"
PROCESSES: Final = (WORKER, SCHEDULER, RELAYER, INGRESS, CONSOLE)
# The scheduler reads the database gauges: it runs in every deployment (without it no timer
# fires), as one or two replicas rather than a fleet scaled with the load, and its scrape's
# statement competes with no claim. With two schedulers, take ``max`` across them.
DATABASE_GAUGES_PROCESS: Final = SCHEDULER
MAX_LABEL_VALUES: Final = 100  # distinct values of a label that comes from data, per process

_M = TypeVar("_M", Counter, Gauge, Histogram)
_EXPORTERS: dict[str, frozenset[str]] = {}  # family name (no _total) -> the processes exporting it


def _exported_by(metric: _M, *processes: str) -> _M:
    for family in metric.describe():
        _EXPORTERS[family.name] = frozenset(processes)
    return metric


def exported_by(process: str) -> frozenset[str]:
    """The event families ``process`` exports (as ``prometheus_client`` names families:
    a counter without its ``_total``)."""
    return frozenset(name for name, exporters in _EXPORTERS.items() if process in exporters)


def event_families() -> Mapping[str, frozenset[str]]:
    """Every event family and the processes that export it."""
    return dict(_EXPORTERS)


class BoundedLabel:
    """A label whose values come from data: the first ``limit`` distinct values keep
    their own series, any later one is ``other`` (a flood of names cannot make a
    scrape, or Prometheus's memory, grow without end)."""

    def __init__(self, limit: int = MAX_LABEL_VALUES) -> None:
        self.limit = limit
        self._kept: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self._kept:
            return value
        if len(self._kept) < self.limit:
            self._kept.add(value)
            return value
        return "other"


# ---------------------------------------------------------------- worker

CLAIM_DURATION = _exported_by(
    Histogram(
        "kenning_claim_duration_seconds",
        "Time of one claim statement (it takes up to every free slot's instance at once)",
        buckets=FAST_BUCKETS,
    ),
    WORKER,
)
CLAIMED = _exported_by(
    Counter("kenning_claimed_instances_total", "Instances claimed by this worker", ["workflow"]),
    WORKER,
)
LEASE_TAKEOVERS = _exported_by(
    Counter(
        "kenning_lease_takeovers_total",
        "Instances claimed whose previous run did not end cleanly (its lease expired, or it crashed)",
        ["workflow"],
    ),
    WORKER,
)
QUEUE_KEY_RATE_LIMITED = _exported_by(
    Counter(
        "kenning_queue_rate_limited_total",
        "Queued instances a claim held back for their partition key's rate limit (moved to when its window frees)",
        ["queue"],
    ),
    WORKER,
)
QUEUE_STRATEGY_STARTS = _exported_by(
    Counter(
        "kenning_queue_strategy_starts_total",
        "Starts over their partition key's limit decided by the queue's partition_strategy: the start cancelled "
        "(cancel_newest), the key's oldest cancelled (cancel_in_progress), the running one returned (singleton)",
        ["queue", "strategy"],
    ),
    WORKER,
    SCHEDULER,
    INGRESS,
)
LEASES_LOST = _exported_by(
    Counter("kenning_leases_lost_total", "Runs cancelled by this worker because another took their lease over"),
    WORKER,
)
WORKFLOW_RUN_DURATION = _exported_by(
    Histogram(
        "kenning_workflow_run_duration_seconds",
        "Time of one run of a workflow instance, from its claim to where it came to rest, by outcome "
        "(completed, failed, cancelled, suspended, lease_lost; released: cancelled at shutdown; "
        "storage_unavailable; crashed)",
        ["workflow", "outcome"],
        buckets=SLOW_BUCKETS,
    ),
    WORKER,
)
STEP_DURATION = _exported_by(
    Histogram(
        "kenning_step_duration_seconds",
        "Time of one attempt of an activity or compensation, by workflow, step and outcome (completed, failed)",
        ["workflow", "step", "outcome"],
        buckets=SLOW_BUCKETS,
    ),
    WORKER,
)
STEP_RETRIES = _exported_by(
    Counter(
        "kenning_step_retries_total",
        "Retries scheduled after a failed attempt of an activity or compensation",
        ["workflow", "step"],
    ),
    WORKER,
)
NON_DETERMINISM_ERRORS = _exported_by(
    Counter(
        "kenning_nondeterminism_errors_total",
        "Runs failed because the code no longer replays the recorded history",
        ["workflow"],
    ),
    WORKER,
)
INBOX_PARKED = _exported_by(
    Counter("kenning_inbox_parked_total", "Inbox rows parked as failed after their last delivery attempt"),
    WORKER,
)
EVENTS_NO_RECEIVER = _exported_by(
    Counter(
        "kenning_events_no_receiver_total",
        "Events processed with nothing to receive them (no handler, no workflow started, no instance waiting), by type"
        " (the first 100 types a worker meets; the rest as 'other')",
        ["event_type"],
    ),
    WORKER,
)

FOLDED_STARTS = _exported_by(
    Counter(
        "kenning_folded_starts_total",
        "Starts and events taken by flow control per key: kind debounce or batch, outcome opened (the first of"
        " its burst or batch: a new instance) or joined (folded into an open one)",
        ["kind", "outcome"],
    ),
    WORKER,
)

# ---------------------------------------------------------------- scheduler, relayer

TIMER_LATENESS = _exported_by(
    Histogram(
        "kenning_timer_lateness_seconds",
        "How long after its due time a timer or a wait's timeout fired (kind: timer, event_timeout, receive_timeout)",
        ["kind"],
        buckets=LATENESS_BUCKETS,
    ),
    SCHEDULER,
)
LEASES_LOCKED = _exported_by(
    Counter(
        "kenning_leases_locked_past_expiry_total",
        "Instances the stuck check found with an expired lease and their row still locked by a live transaction "
        "(a process cut off mid-transaction: no claim takes them over until that session ends), once per check",
    ),
    SCHEDULER,
)
OUTBOX_DELIVERIES = _exported_by(
    Counter(
        "kenning_outbox_deliveries_total",
        "Outbox delivery attempts by outcome (published, retry, dead_letter)",
        ["outcome"],
    ),
    RELAYER,
)

# ---------------------------------------------------------------- ingress, shared

INGRESS_REQUESTS = _exported_by(
    Counter("kenning_ingress_requests_total", "Ingress HTTP requests by route and status code", ["route", "status"]),
    INGRESS,
)
INGRESS_REQUEST_DURATION = _exported_by(
    Histogram(
        "kenning_ingress_request_duration_seconds",
        "Ingress HTTP request latency by route",
        ["route"],
        buckets=FAST_BUCKETS,
    ),
    INGRESS,
)
SOURCE_MESSAGES = _exported_by(
    Counter(
        "kenning_source_messages_total",
        "Messages a broker source (kenning ingress --source) took, by outcome (stored: written to the inbox, "
        "a duplicate included, then acked; rejected: malformed, to the broker's dead letters; released: handed "
        "back for redelivery, the database away or an internal error)",
        ["source", "outcome"],
    ),
    INGRESS,
)
SOURCE_SETTLE_FAILURES = _exported_by(
    Counter(
        "kenning_source_settle_failures_total",
        "Acks, rejections and releases a broker did not take (its connection gone): it delivers the message again",
        ["source", "action"],
    ),
    INGRESS,
)
GROUP_COMMIT_BATCH_SIZE = _exported_by(
    Histogram(
        "kenning_group_commit_batch_size",
        "Items written by one group-commit statement (writer: ingress inbox, worker steps, starts)",
        ["writer"],
        buckets=BATCH_BUCKETS,
    ),
    INGRESS,
    WORKER,
    CONSOLE,
)

# ---------------------------------------------------------------- every process

COMMIT_STALL = _exported_by(
    Gauge(
        "kenning_commit_stall_seconds",
        "How long this process's commit probe has waited for its commit (0: commits complete); past "
        "--commit-stall-seconds the process is not ready (kenning.hosting.commitwatch)",
        # the ingress's uvicorn workers: the longest wait of the live ones
        multiprocess_mode="livemax",
    ),
    *PROCESSES,
)

# ---------------------------------------------------------------- console

CONSOLE_REQUESTS = _exported_by(
    Counter(
        "kenning_console_requests_total",
        "Console HTTP requests by route (the path template, as /instances/{instance_id}) and status code",
        ["route", "status"],
    ),
    CONSOLE,
)
CONSOLE_REQUEST_DURATION = _exported_by(
    Histogram(
        "kenning_console_request_duration_seconds",
        "Console HTTP request latency by route (a live stream: until it closed)",
        ["route"],
        buckets=FAST_BUCKETS,
    ),
    CONSOLE,
)

# ---------------------------------------------------------------- database gauges


# Label values the code bounds, known when a process starts (kenning_scheduler's
# _LATENESS_KIND, kenning_relayer's outcomes, kenning_ingress's routes).
TIMER_LATENESS_KINDS = ("timer", "event_timeout", "receive_timeout")
OUTBOX_OUTCOMES = ("published", "retry", "dead_letter")


def zero_series(process: str, *, workflows: Iterable[str] = (), routes: Iterable[str] = ()) -> None:
    """Make ``process``'s series whose labels are known at its start, at 0: a scrape right
    after the start shows them, and ``rate()`` has a baseline from the first scrape on. A
    labelled family has no series until its first increment otherwise, so a fresh process's
    ``/metrics`` held none of its ``kenning_`` counters. ``workflows``: a worker's own
    workflow names (bounded like any workflow label); ``routes``: the ingress's."""
    if process == WORKER:
        for workflow in workflows:
            CLAIMED.labels(workflow)
            LEASE_TAKEOVERS.labels(workflow)
            NON_DETERMINISM_ERRORS.labels(workflow)
    elif process == SCHEDULER:
        for kind in TIMER_LATENESS_KINDS:
            TIMER_LATENESS.labels(kind)
    elif process == RELAYER:
        for outcome in OUTBOX_OUTCOMES:
            OUTBOX_DELIVERIES.labels(outcome)
    elif process == INGRESS:
        for route in routes:
            INGRESS_REQUEST_DURATION.labels(route)


class DatabaseGauges(Collector):
    """The gauges of one snapshot of the database (``storage.metrics.metrics_snapshot``),
    or, when the statement failed (``rows`` None), only ``kenning_database_metrics_up 0``.

    A workflow seen in an earlier scrape of this process keeps its series at 0 once it
    has nothing claimable: a backlog that drains reads 0, not "no data"."""

    _seen_workflows: ClassVar[set[str]] = set()  # per process, across scrapes
    _workflow_label: ClassVar[BoundedLabel] = BoundedLabel()  # names in the database are data
    _version_label: ClassVar[BoundedLabel] = BoundedLabel()  # so are code versions

    def __init__(self, rows: Sequence[MetricsRow] | None) -> None:
        self.rows = rows

    def collect(self) -> Iterable[Metric]:
        up = GaugeMetricFamily("kenning_database_metrics_up", "1 if this scrape's database gauges were read, else 0")
        up.add_metric([], 0 if self.rows is None else 1)
        yield up
        if self.rows is None:
            return
        yield from self._instances([r for r in self.rows if r.area == "instances"])
        stuck = GaugeMetricFamily(
            "kenning_stuck_instances",
            "Instances the scheduler's stuck check marked because a repair cannot help, by reason",
            labels=["workflow", "reason"],
        )
        marked: dict[tuple[str, str], int] = {}
        for row in self.rows:
            if row.area == "stuck":
                key = (self._workflow_label(row.workflow), row.status)
                marked[key] = marked.get(key, 0) + row.total
        for (workflow, reason), total in marked.items():
            stuck.add_metric([workflow, reason], total)
        yield stuck
        yield self._pinned([r for r in self.rows if r.area == "pinned"])
        for row in self.rows:
            if row.area == "timers":
                yield from self._timers(row)
            elif row.area == "inbox":
                yield from self._inbox(row)
        yield from self._outbox([r for r in self.rows if r.area == "outbox"])
        yield from self._queues([r for r in self.rows if r.area == "queues"])
        yield from self._processes([r for r in self.rows if r.area == "processes"])

    def _pinned(self, rows: Sequence[MetricsRow]) -> Metric:
        pinned = GaugeMetricFamily(
            "kenning_pinned_instances_without_worker",
            "Due instances pinned (@workflow(versioning='pinned')) to a code version no live worker runs: nothing "
            "claims them until a worker of that version runs",
            labels=["workflow", "version"],
        )
        waiting: dict[tuple[str, str], int] = {}
        for row in rows:
            key = (self._workflow_label(row.workflow), self._version_label(row.status))
            waiting[key] = waiting.get(key, 0) + row.total
        for (workflow, version), total in waiting.items():
            pinned.add_metric([workflow, version], total)
        return pinned

    def _instances(self, rows: Sequence[MetricsRow]) -> Iterable[Metric]:
        by_status = GaugeMetricFamily(
            "kenning_instances",
            "Unfinished workflow instances by status",
            labels=["workflow", "status"],
        )
        runnable = GaugeMetricFamily(
            "kenning_runnable_instances",
            "Instances a worker could claim now (new, woken, backed off, or whose lease expired)",
            labels=["workflow"],
        )
        oldest = GaugeMetricFamily(
            "kenning_oldest_runnable_age_seconds",
            "How long the oldest runnable instance has been claimable",
            labels=["workflow"],
        )
        totals: dict[tuple[str, str], int] = {}
        due: dict[str, int] = {}
        age: dict[str, float] = {}
        for row in rows:
            workflow = self._workflow_label(row.workflow)  # 'other' sums the workflows past the bound
            totals[workflow, row.status] = totals.get((workflow, row.status), 0) + row.total
            due[workflow] = due.get(workflow, 0) + row.due
            if row.oldest_seconds is not None:
                age[workflow] = max(age.get(workflow, 0.0), row.oldest_seconds)
        for (workflow, status), total in totals.items():
            by_status.add_metric([workflow, status], total)
        self._seen_workflows.update(due)
        for workflow in sorted(self._seen_workflows):
            runnable.add_metric([workflow], due.get(workflow, 0))
            oldest.add_metric([workflow], age.get(workflow, 0.0))
        yield from (by_status, runnable, oldest)

    @staticmethod
    def _timers(row: MetricsRow) -> Iterable[Metric]:
        yield GaugeMetricFamily("kenning_timers", "Timers waiting to fire", value=row.total)
        yield GaugeMetricFamily("kenning_timers_due", "Timers due but not fired yet", value=row.due)

    @staticmethod
    def _inbox(row: MetricsRow) -> Iterable[Metric]:
        yield GaugeMetricFamily(
            "kenning_inbox_backlog", "Inbox rows (events, cancels) not processed yet", value=row.total
        )
        yield GaugeMetricFamily(
            "kenning_inbox_oldest_age_seconds",
            "Age of the oldest unprocessed inbox row, since it was received (0: none)",
            value=row.oldest_seconds or 0.0,
        )
        yield GaugeMetricFamily(
            "kenning_inbox_retrying", "Unprocessed inbox rows with a failed attempt behind them", value=row.retrying
        )

    @staticmethod
    def _outbox(rows: Sequence[MetricsRow]) -> Iterable[Metric]:
        pending = next((r for r in rows if r.status == "pending"), None)
        failed = next((r for r in rows if r.status == "failed"), None)
        if pending is not None:
            yield GaugeMetricFamily(
                "kenning_outbox_backlog", "Outbox events not published yet (pending or publishing)", value=pending.total
            )
            yield GaugeMetricFamily(
                "kenning_outbox_oldest_age_seconds",
                "Age of the oldest unpublished outbox event, since it was written (0: none)",
                value=pending.oldest_seconds or 0.0,
            )
            yield GaugeMetricFamily(
                "kenning_outbox_retrying",
                "Unpublished outbox events with a failed attempt behind them",
                value=pending.retrying,
            )
        if failed is not None:
            yield GaugeMetricFamily(
                "kenning_outbox_dead_letters", "Outbox events that failed for good (status failed)", value=failed.total
            )

    @staticmethod
    def _queues(rows: Sequence[MetricsRow]) -> Iterable[Metric]:
        # every queue of kenning_queues has a row (queues are never deleted), so a queue
        # that drains reads 0 without remembering it across scrapes
        depth = GaugeMetricFamily(
            "kenning_queue_depth",
            "Runnable instances of a queue not held by a worker (waiting for a slot, due or backing off)",
            labels=["queue"],
        )
        running = GaugeMetricFamily(
            "kenning_queue_running",
            "Instances of a queue held by an unexpired lease (the slots its limits count)",
            labels=["queue"],
        )
        oldest = GaugeMetricFamily(
            "kenning_queue_oldest_age_seconds",
            "How long the oldest claimable instance of a queue has been claimable (0: none)",
            labels=["queue"],
        )
        paused = GaugeMetricFamily(
            "kenning_queue_paused",
            "1 if an operator paused the queue (its claim takes nothing), else 0",
            labels=["queue"],
        )
        for row in rows:
            depth.add_metric([row.workflow], row.total)
            running.add_metric([row.workflow], row.leased)
            oldest.add_metric([row.workflow], row.oldest_seconds or 0.0)
            paused.add_metric([row.workflow], 1 if row.status == "paused" else 0)
        yield from (depth, running, oldest, paused)

    @staticmethod
    def _processes(rows: Sequence[MetricsRow]) -> Iterable[Metric]:
        # a row per kind, always: a fleet that lost its last worker reads 0 (an alert's figure)
        live = GaugeMetricFamily(
            "kenning_processes_live",
            "Processes of the fleet's registry heartbeating within their expiry, by kind (kenning workers list)",
            labels=["kind"],
        )
        for row in rows:
            live.add_metric([row.workflow], row.total)
        yield live
