"""A real S3 server for the tests: SeaweedFS, started by ``kenning_devtools.seaweedfs``
(which ``kenning bench --sections offload`` uses too) on ports of ``tests.ports``.

A test module makes one with ``seaweedfs(directory)`` (a module-scoped fixture) and gets an
``S3Server``: the ``KENNING_OBJECT_STORE`` URL and the AWS variables its processes need.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from kenning_devtools import seaweedfs as weed
from kenning_devtools.seaweedfs import S3Server
from tests.ports import free_ports

BUCKET = "kenning-test"

__all__ = ["BUCKET", "S3Server", "seaweedfs"]


@contextmanager
def seaweedfs(directory: Path) -> Iterator[S3Server]:
    """A SeaweedFS server with the tests' bucket, until the block ends (skips without ``weed``)."""
    if weed.missing() is not None:
        pytest.skip(f"{weed.missing()}, for the object store tests")
    with weed.seaweedfs(directory, free_ports(weed.PORTS), bucket=BUCKET, access_key="kenning-test") as server:
        yield server
