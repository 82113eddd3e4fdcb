"""The ingress's worker processes (``--workers N``) die with the ingress that started them.

uvicorn's supervisor stops its workers when it is stopped, but a supervisor killed with
``kill -9`` (or OOM-killed) cannot: its workers would go on serving, holding the port, so
that the restarted ingress cannot bind it. Each worker therefore ties its life to its
parent's, before the app is built:

- on Linux, ``prctl(PR_SET_PDEATHSIG, SIGTERM)``: the kernel sends SIGTERM the moment the
  parent dies, and uvicorn shuts the worker down gracefully (requests in flight finish);
- everywhere, a daemon thread polls ``os.getppid()`` (every half second): it covers a
  parent that died before the ``prctl`` call, is the mechanism on systems without
  ``prctl``, and ends a worker whose graceful shutdown takes longer than ``GRACE_SECONDS``.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time

import structlog
from starlette.applications import Starlette

from kenning_ingress.app import app_from_environment

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
POLL_SECONDS = 0.5
GRACE_SECONDS = 10.0  # after the parent died: for requests in flight, then the worker exits regardless


def worker_app() -> Starlette:
    """The uvicorn factory: the ingress app, in a worker process tied to its parent.

    With one worker uvicorn runs the app in the ingress process itself, which has no
    multiprocessing parent: nothing to tie then.
    """
    parent = multiprocessing.parent_process()
    if parent is None or parent.pid is None:
        return app_from_environment()
    kernel = _ask_kernel(signal.SIGTERM)  # first: the sooner, the smaller the window
    app = app_from_environment()  # configures logging
    watch_parent(parent.pid)
    structlog.get_logger("kenning.ingress").debug("ingress.worker_tied", parent=parent.pid, pdeathsig=kernel)
    return app


def watch_parent(parent_pid: int) -> None:
    """SIGTERM this process once ``parent_pid`` is no longer its parent (it died, even
    before the kernel was asked), and exit ``GRACE_SECONDS`` later at the latest."""
    threading.Thread(target=_watch, args=(parent_pid,), name="kenning-lifeline", daemon=True).start()


def _ask_kernel(sig: int) -> bool:
    """``prctl(PR_SET_PDEATHSIG, sig)``; False where there is no such call."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _watch(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(POLL_SECONDS)
    structlog.get_logger("kenning.ingress").warning("ingress.parent_died", parent=parent_pid)
    # A no-op if the kernel already sent it: uvicorn counts it as the same request to stop.
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(GRACE_SECONDS)
    os._exit(1)  # still here: a request or the shutdown hangs, and nobody else will stop us
