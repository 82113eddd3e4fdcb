"""The one way a test gets a port for a server it starts: :func:`free_port` (``tests.support``
re-exports it).

Three things could take the port between the pick and the server's bind, and none can:

- An outgoing connection of any process on the machine: the ports are below the kernel's
  ephemeral range (``kenning_devtools.ports.TEST_PORTS``), which client sockets draw from;
  that is why not ``bind(0)``.
- ``kenning up`` or ``kenning bench`` started by hand or by a test without ports: their random
  picks start above ``TEST_PORTS`` (``kenning_devtools.ports``).
- Another test, of this pytest session or of another one on the machine: each test process
  (a pytest-xdist worker, or a session run without workers) owns a block of
  ``PORTS_PER_PROCESS`` ports, held by an exclusive ``flock`` on the block's lock file for the
  life of the process (the kernel releases it when the process ends, however it ends), and
  hands each port of it out once per pass through the block. A worker numbered by xdist is
  no guarantee: two sessions both have a ``gw0``.

Each pick is still checked by a bind: a server a test left running keeps its port.
"""

from __future__ import annotations

import fcntl
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from kenning_devtools import ports

PORTS_PER_PROCESS = 400
LOCK_DIR = Path(tempfile.gettempdir()) / "kenning-test-ports"


class _Block:
    """This process's block of ports, claimed on first use."""

    def __init__(self) -> None:
        self._lock: IO[str] | None = None  # open while the process lives: the claim
        self.ports = range(0)
        self._cycle: Iterator[int] = iter(())

    def claim(self) -> range:
        if self._lock is None:
            self.ports, self._lock = _claim_block()
            self._cycle = _cycle(self.ports)
        return self.ports

    def next(self) -> int:
        self.claim()
        return next(self._cycle)


def _claim_block() -> tuple[range, IO[str]]:
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    count = len(ports.TEST_PORTS) // PORTS_PER_PROCESS
    for index in range(count):
        lock = open(LOCK_DIR / f"block-{index}.lock", "a")  # noqa: SIM115 (held until the process ends)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        start = ports.TEST_PORTS.start + index * PORTS_PER_PROCESS
        return range(start, start + PORTS_PER_PROCESS), lock
    raise RuntimeError(
        f"all {count} blocks of test ports ({ports.TEST_PORTS.start}-{ports.TEST_PORTS.stop - 1}) are held by "
        "other test processes on this machine: run fewer pytest workers or sessions at once"
    )


def _cycle(block: range) -> Iterator[int]:
    while True:
        yield from block


_block = _Block()


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive free ports (``kenning up --metrics-port`` takes
    such a run); none of them is handed out again this pass."""
    block = _block.claim()
    candidates = (port for port in iter(_block.next, None) if port + count - 1 in block)
    first = ports.free_ports(count, candidates, tries=len(block))
    for _ in range(count - 1):
        _block.next()
    return first


def free_port() -> int:
    """A free port, for a server a test starts."""
    return free_ports(1)


def block() -> range:
    """This process's block (claimed now if it was not yet)."""
    return _block.claim()
