"""PostgreSQL clusters of a test's own, from the machine's PostgreSQL binaries (Debian's
``/usr/lib/postgresql/<version>/bin``): a primary, a streaming standby of it, a server
with TLS. The test may kill, promote and restart them; the machine's shared server is
never touched. A missing binary skips the test that asks, with the reason.

PostgreSQL refuses to run as root: as root, every command runs as the ``postgres`` system
user (which Debian's server package makes), on a directory under the temporary folder
that user owns (pytest's own folders are private to root)."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.support import free_port


def postgres_bin() -> Path | None:
    """The newest installed PostgreSQL's binaries, or None."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name))
    return found[-1].parent if found else None


def run_as() -> str | None:
    """The system user PostgreSQL runs as here: ``postgres`` when this is root, else the caller."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres").pw_name
    except KeyError:
        return None


def require_postgres_bin() -> Path:
    binaries = postgres_bin()
    if binaries is None:
        pytest.skip("no PostgreSQL server binaries under /usr/lib/postgresql (apt-get install postgresql)")
    if os.geteuid() == 0 and run_as() is None:
        pytest.skip("running as root without a 'postgres' system user to run PostgreSQL as")
    return binaries


def run(command: Sequence[str | Path], *, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``command`` as the PostgreSQL user; its output is in the error when it fails."""
    done = subprocess.run(
        [str(part) for part in command], user=run_as(), capture_output=True, text=True, timeout=timeout
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, command))} exited {done.returncode}: {done.stdout}{done.stderr}")
    return done


@contextlib.contextmanager
def owned_directory(prefix: str) -> Iterator[Path]:
    """A directory the PostgreSQL user owns, removed at the end."""
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    user = run_as()
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(directory, entry.pw_uid, entry.pw_gid)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


class Cluster:
    """One PostgreSQL server: its data directory, its port on 127.0.0.1, its log."""

    def __init__(self, binaries: Path, root: Path, name: str, port: int | None = None) -> None:
        self.bin = binaries
        self.root = root
        self.data = root / name
        self.log = root / f"{name}.log"
        self.port = port or free_port()

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def settings(self, *lines: str) -> None:
        """Append ``lines`` to postgresql.auto.conf (read after postgresql.conf: they win)."""
        with open(self.data / "postgresql.auto.conf", "a") as conf:
            conf.write("".join(f"{line}\n" for line in lines))

    def initdb(self, *lines: str) -> Cluster:
        run([self.bin / "initdb", "-D", self.data, "-U", "postgres", "--auth=trust", "-N", "-E", "UTF8"])
        self.settings(*self._own_lines(), *lines)
        return self

    def _own_lines(self) -> list[str]:
        return [
            "listen_addresses = '127.0.0.1'",
            f"port = {self.port}",
            f"unix_socket_directories = '{self.root}'",
            "fsync = off",  # the machine does not crash, the server does: the page cache survives it
            "wal_keep_size = '256MB'",
            "log_min_messages = warning",
        ]

    def standby_of(self, primary: Cluster) -> Cluster:
        """A streaming standby of ``primary`` (a base backup with ``-R``), not started."""
        run([self.bin / "pg_basebackup", "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres", "-D", self.data,
             "-R", "-X", "stream", "-c", "fast"])  # fmt: skip
        self.settings(*self._own_lines())
        return self

    def start(self) -> Cluster:
        run([self.bin / "pg_ctl", "-w", "-t", "60", "-D", self.data, "-l", self.log, "start"], timeout=90)
        return self

    def kill(self) -> None:
        """A power cut: ``-m immediate``, no checkpoint, clients cut."""
        run([self.bin / "pg_ctl", "-w", "-D", self.data, "-m", "immediate", "stop"], check=False)

    def promote(self) -> None:
        run([self.bin / "pg_ctl", "-w", "-t", "60", "-D", self.data, "promote"], timeout=90)

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


@contextlib.contextmanager
def primary_and_standby() -> Iterator[tuple[Cluster, Cluster]]:
    """A started primary and a started streaming standby of it."""
    binaries = require_postgres_bin()
    with owned_directory("kenning-pg-") as root:
        primary = Cluster(binaries, root, "primary").initdb()
        standby = Cluster(binaries, root, "standby")
        try:
            primary.start()
            standby.standby_of(primary).start()
            yield primary, standby
        finally:
            standby.kill()
            primary.kill()
