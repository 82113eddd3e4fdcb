"""CPU of the benchmarked PostgreSQL server: its postmaster's whole process tree.

Summing the live ``postgres`` processes before and after a run (what the throughput
section did) goes negative: a backend that exits inside the window takes the CPU it spent
before the first reading with it, and on a shared machine every other server's processes
come and go in the sum too. Here the server is the one the bench's own connection reaches
(its backend's parent), and its CPU is the postmaster's own, plus what the kernel added to
its ``cutime``/``cstime`` for each child it reaped (exited backends, autovacuum workers,
parallel workers), plus its live children's. A child's CPU moves from the live sum to the
reaped one whole, so the total never falls.

``pg_stat_database``/``pg_stat_statements`` were not used: they count time (and
statements), not CPU, and leave out the background writers and the backend starts. What
the tree cannot separate is other clients of the same server (the tests' shared server):
their backends are children of the same postmaster, and an exited one's CPU is in the same
``cutime``. So the window's other work is read too (:func:`other_work`), and a server others
used in it is reported as not measured rather than with their CPU; the bench's own
embedded or container server has no others.
"""

from __future__ import annotations

import contextlib
from typing import Any, NamedTuple

import psutil
import psycopg
from psycopg.rows import dict_row

POSTGRES_NAMES = ("postgres", "postmaster")
START_TIME_SLACK = 2.0  # seconds between pg_postmaster_start_time() and the process's start
CONSISTENT_READS = 20  # tries at a reading no child was reaped in the middle of


def postmaster_of(url: str) -> psutil.Process | None:
    """The local postmaster of the server at ``url``, or None when it is not on this
    machine (a remote server, or one in a container whose process ids are not ours)."""
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        row = conn.execute(
            "SELECT pg_backend_pid() AS pid, extract(epoch FROM pg_postmaster_start_time()) AS started"
        ).fetchone()
        if row is None:
            return None
        try:  # while the backend is still there to have a parent
            postmaster = psutil.Process(int(row["pid"])).parent()
            if postmaster is None or postmaster.name() not in POSTGRES_NAMES:
                return None
            # a pid from another namespace can name any local process: the start time tells
            if abs(postmaster.create_time() - float(row["started"])) > START_TIME_SLACK:
                return None
        except psutil.Error:
            return None
    return postmaster


def _own_and_reaped(times: Any) -> float:
    return float(times.user + times.system + times.children_user + times.children_system)


def tree_cpu_seconds(postmaster: psutil.Process) -> float | None:
    """User and system CPU of ``postmaster``'s tree, exited children included; None once
    the postmaster is gone (a restarted server's counts start over)."""
    for _ in range(CONSISTENT_READS):
        try:
            before = postmaster.cpu_times()
            live = 0.0
            for child in postmaster.children(recursive=True):
                with contextlib.suppress(psutil.NoSuchProcess):
                    live += _own_and_reaped(child.cpu_times())
            after = postmaster.cpu_times()
        except psutil.NoSuchProcess:
            return None
        # a child reaped between the two readings of the postmaster could be counted twice
        # (live, then reaped) or not at all: read again
        if (before.children_user, before.children_system) == (after.children_user, after.children_system):
            return _own_and_reaped(after) + live
    # backends churning too fast to catch still: off by the children reaped during the last read
    return _own_and_reaped(after) + live


class OtherWork(NamedTuple):
    """Other databases' use of the server: transactions so far and sessions now."""

    transactions: int
    sessions: int


def other_work(url: str) -> OtherWork:
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        row = conn.execute(
            "SELECT (SELECT coalesce(sum(xact_commit + xact_rollback), 0) FROM pg_stat_database"
            "        WHERE datname <> current_database()) AS transactions,"
            "       (SELECT count(*) FROM pg_stat_activity"
            "        WHERE backend_type = 'client backend' AND datname <> current_database()) AS sessions"
        ).fetchone()
    assert row is not None  # an aggregate's row
    return OtherWork(int(row["transactions"]), int(row["sessions"]))


def shared(before: OtherWork, after: OtherWork) -> bool:
    """Whether other databases used the server between two readings (a busy backend may
    hold its counters back for seconds, so the sessions seen at either end count too)."""
    return before.transactions != after.transactions or before.sessions > 0 or after.sessions > 0
