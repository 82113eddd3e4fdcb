"""What one ``kenning up`` must have to itself, claimed before it starts anything: its data
directory and the ports of the servers it starts.

Two ``up`` in one folder wrote into each other's logs and health files (and the second
one's embedded PostgreSQL would stop the first one's as an orphan): the data directory is
held with a lock on ``up.lock`` (``flock``: the kernel drops it when the process ends,
however it ends). A port another server holds (another stack's ingress, which answers
``/readyz`` as this one's would) is refused before anything starts, in one line.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from kenning.errors import UsageError

LOCK_FILE = "up.lock"


@contextlib.contextmanager
def data_dir_lock(data_dir: Path) -> Iterator[None]:
    """Hold ``data_dir`` for this process while the block runs; ``UsageError`` naming the
    holder's PID when another process holds it."""
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by the children
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            who = f" (pid {holder})" if holder.isdigit() else ""
            raise UsageError(
                f"another kenning up{who} is running with the data directory {data_dir}: "
                "stop it first, or give this one a --data-dir of its own"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)  # for the message of the next one
        yield
    finally:
        os.close(fd)


def in_use(host: str, port: int) -> bool:
    """Whether a server could not bind ``host:port`` now. With ``SO_REUSEADDR``, as uvicorn
    binds: a port whose last connections wait in TIME_WAIT (an ``up`` just stopped) is
    free, one a socket listens on is not."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def check_ports_free(ports: dict[str, tuple[str, int]]) -> None:
    """``UsageError`` for the first of ``ports`` (what serves there -> its address) that is
    in use."""
    for what, (host, port) in ports.items():
        if in_use(host, port):
            raise UsageError(
                f"port {port} on {host} is in use ({what}): another kenning up or another server "
                "holds it; stop that, or choose another port"
            )
