"""The side channel: the file test activities append a line to each time they run, so a
test counts executions across processes. Test apps import it in every worker they run in,
so it imports nothing heavy (tests/support.py's httpx and psutil cost 0.15 s of CPU per
process start)."""

from __future__ import annotations

import os
from collections import Counter


def executions(path: str) -> Counter[str]:
    """How often each ``activity instance`` line was written to the side channel."""
    with open(path) as fh:
        return Counter(line.strip() for line in fh if line.strip())


def record_execution(label: str) -> None:
    """Called by test activities: append one line, atomically, to the side channel."""
    path = os.environ.get("KENNING_TEST_SIDE_CHANNEL")
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, (label + "\n").encode())
        finally:
            os.close(fd)
