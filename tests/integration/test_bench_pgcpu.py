"""The bench's PostgreSQL CPU: a backend that exits inside the measured window keeps the CPU
it spent in it, and takes none of what it spent before away (the sum of live ``postgres``
processes the throughput table used went negative then); and a server other databases use
in the window is told apart, as their CPU is in the same tree."""

from __future__ import annotations

import time

import psutil
import psycopg
import pytest

from kenning.hosting.embedded import with_database
from kenning_devtools.bench.pgcpu import other_work, postmaster_of, shared, tree_cpu_seconds

# about half a second of one backend's CPU; counters tick in 10 ms
BURN = "SELECT count(*) FROM generate_series(1, 5000000)"


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def test_a_backend_exiting_inside_the_window_keeps_its_cpu(database_url: str) -> None:
    postmaster = postmaster_of(database_url)
    if postmaster is None:
        pytest.skip("the tests' PostgreSQL is not a process on this machine (a container or a remote server)")
    conn = psycopg.connect(database_url, autocommit=True)
    backend = psutil.Process(conn.info.backend_pid)
    for _ in range(3):  # before the window: the old sum lost this when the backend exited
        conn.execute(BURN)
    spent_before = _cpu(backend)
    assert spent_before > 0.15

    before = tree_cpu_seconds(postmaster)
    conn.execute(BURN)
    spent_inside = _cpu(backend) - spent_before
    conn.close()
    deadline = time.monotonic() + 10
    while backend.is_running() and backend.status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the backend did not exit"
        time.sleep(0.01)
    after = tree_cpu_seconds(postmaster)

    assert before is not None and after is not None
    # other clients of a shared server only add to the difference
    assert after - before >= spent_inside > 0.05


def test_the_servers_tree_reading_never_falls_while_backends_come_and_go(database_url: str) -> None:
    postmaster = postmaster_of(database_url)
    if postmaster is None:
        pytest.skip("the tests' PostgreSQL is not a process on this machine (a container or a remote server)")
    readings = [tree_cpu_seconds(postmaster)]
    for _ in range(20):
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("SELECT count(*) FROM generate_series(1, 200000)")
        readings.append(tree_cpu_seconds(postmaster))
    values = [r for r in readings if r is not None]
    assert len(values) == len(readings)
    assert values == sorted(values)
    assert values[-1] > values[0]


def test_another_databases_session_marks_the_server_shared(database_url: str) -> None:
    before = other_work(database_url)
    with psycopg.connect(with_database(database_url, "postgres"), autocommit=True) as other:
        other.execute("SELECT 1")
        during = other_work(database_url)
    assert during.sessions >= 1
    assert shared(before, during)
    assert shared(before._replace(sessions=0), during._replace(sessions=0, transactions=before.transactions + 1))
    assert not shared(before._replace(sessions=0), before._replace(sessions=0))
