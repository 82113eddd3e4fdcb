"""``kenning ingress --workers N``: the uvicorn worker processes die with the ingress that
started them, so a ``kill -9`` of the ingress leaves no process holding its port."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys

import psutil
import pytest

from tests.ingress_support import spawn_ingress, wait_until_serving
from tests.support import ProcessPool, eventually


def gone(process: psutil.Process) -> bool:
    """Exited (a zombie left for whoever adopted it holds no port either)."""
    try:
        return bool(process.status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def port_free(port: int) -> bool:
    """Whether a new server could listen on ``port`` (as uvicorn binds: SO_REUSEADDR)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
        except OSError:
            return False
        return True


@pytest.mark.skipif(sys.platform != "linux", reason="the test reads the process tree the Linux way; see the README")
async def test_ingress_workers_exit_when_the_ingress_is_killed(database_url: str, processes: ProcessPool) -> None:
    ingress = spawn_ingress(processes, database_url, "--workers", "2")
    parent = psutil.Process(ingress.process.pid)
    wait_until_serving(ingress.url, ingress.process, timeout=60)

    def workers() -> list[psutil.Process]:
        # uvicorn's workers are spawned interpreters (multiprocessing's resource tracker,
        # if one runs, is not one of them)
        return [c for c in parent.children() if "resource_tracker" not in " ".join(c.cmdline())]

    await eventually(lambda: len(workers()) == 2, timeout=60, message="two uvicorn workers")
    children = parent.children(recursive=True)
    port = int(ingress.url.rsplit(":", 1)[1])
    try:
        ingress.process.send_signal(signal.SIGKILL)
        ingress.process.wait(timeout=10)
        await eventually(
            lambda: all(gone(c) for c in children), timeout=15, message="every worker exited with its parent"
        )
        await eventually(lambda: port_free(port), timeout=10, message=f"port {port} free again")
    finally:  # never leave orphans serving the port to later tests
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()


# A parent that starts a child which ties itself with the polling fallback only (no prctl),
# prints the child's pid, and waits.
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", '''
import os, time
from kenning_ingress.lifeline import watch_parent
watch_parent(os.getppid())
print("tied", flush=True)
time.sleep(120)
'''])
print(child.pid, flush=True)
time.sleep(120)
"""


async def test_without_the_kernel_a_polling_thread_ends_the_orphan() -> None:
    parent = psutil.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    child: psutil.Process | None = None
    try:
        assert parent.stdout is not None
        lines = {parent.stdout.readline().strip() for _ in range(2)}
        assert "tied" in lines, lines
        child = psutil.Process(int(next(line for line in lines if line.isdigit())))
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        await eventually(lambda: gone(child), timeout=15, message="the orphan exited")
    finally:
        with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
            parent.kill()
        if parent.stdout is not None:
            parent.stdout.close()
        if child is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
