"""The one way a test gets a port (``tests/ports.py``): two test processes that run at once,
of one pytest session or of two, never hold the same block of ports. Before, the block was
chosen by the pytest-xdist worker's number alone, and two sessions on one machine (each
with a ``gw0``, or each without workers) handed out the same ports at the same time."""

from __future__ import annotations

import subprocess
import sys

from kenning_devtools.ports import TEST_PORTS
from tests.ports import PORTS_PER_PROCESS
from tests.support import REPO_ROOT

# a test process: its first port, then held (and with it its block) until told to end
HOLDER = "import sys; from tests.support import free_port; print(free_port(), flush=True); sys.stdin.readline()"


def test_two_test_processes_at_once_get_ports_of_different_blocks() -> None:
    holders = [
        subprocess.Popen(
            [sys.executable, "-c", HOLDER],
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT), "PYTEST_XDIST_WORKER": "gw0"},
        )
        for _ in range(2)
    ]
    try:
        first, second = (int(holder.stdout.readline()) for holder in holders if holder.stdout is not None)
    finally:
        for holder in holders:
            holder.communicate("\n", timeout=30)
    assert block_of(first) != block_of(second), (first, second)


def block_of(port: int) -> int:
    return (port - TEST_PORTS.start) // PORTS_PER_PROCESS
