"""Free TCP ports for the servers ``kenning up``, ``kenning bench`` and the tests start.

``bind(0)`` would pick a port from the kernel's ephemeral range, which every outgoing
connection also draws its local port from: between the pick and the server's own bind, a
client socket of any process on the machine can take it, and the server fails with
"address already in use" (a full test run once lost a console's port so). The ports here
are below that range, checked by a bind.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator
from pathlib import Path

# The tests hand out ports of their own from TEST_PORTS, a block per pytest-xdist worker
# (tests/support.py); the random picks start above them, so the two never meet.
TEST_PORTS = range(10_000, 20_000)


def ephemeral_ports_start() -> int:
    """The first port of the kernel's ephemeral range."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default; the IANA range starts higher still


def bindable(port: int) -> bool:
    """Nothing holds ``port`` on 127.0.0.1 (a listening server, or a socket bound to it)."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _kernel_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _random_ports() -> Iterator[int]:
    end = ephemeral_ports_start()
    while True:
        if end > TEST_PORTS.stop:
            yield random.randrange(TEST_PORTS.stop, end)
        else:  # an ephemeral range this wide leaves nothing below it: the kernel's choice
            yield _kernel_port()


def free_ports(count: int = 1, candidates: Iterator[int] | None = None, tries: int = 1_000) -> int:
    """The first of ``count`` consecutive free ports, trying the first ports ``candidates``
    gives (random ones below the ephemeral range by default)."""
    pick = candidates if candidates is not None else _random_ports()
    for _ in range(tries):
        first = next(pick)
        if all(bindable(port) for port in range(first, first + count)):
            return first
    raise RuntimeError(f"found no {count} free consecutive port(s) in {tries} tries")


def free_port() -> int:
    """A free port below the ephemeral range."""
    return free_ports(1)
