"""How the suite runs on several pytest-xdist workers (``-n auto`` in pyproject's addopts),
and beside other pytest sessions on the same machine.

- How many: :func:`workers`. The whole suite (no paths named, or a folder) runs on
  ``WORKERS`` workers: most tests wait on real processes, sockets and PostgreSQL, not on the
  CPU, so more workers than the 2 cores of CI still shorten the run. Named files or test IDs
  (``pytest tests/integration/test_db.py``) run in one process, as before: starting workers
  would cost more than it saves. So does the unit tier (``pytest tests/unit`` or ``-m unit``,
  ``tests/tiers.py``): its tests wait on nothing but the CPU, and four workers each importing
  and collecting took longer than one process running them all (33 s against 29 s, measured).
  ``-n N`` or ``PYTEST_XDIST_AUTO_NUM_WORKERS`` choose otherwise.
- What runs alone: a test marked ``@pytest.mark.serial`` (it measures throughput or pushes
  the machine hard enough that neighbours would distort it or miss their deadlines) waits
  until the tests running on the other workers end, and none starts until it is done:
  :func:`turn` takes a file lock, shared by ordinary tests, exclusive for serial ones, with a
  turnstile so a waiting serial test is not starved by a stream of ordinary ones.
- What starts first: the files with the longest tests (``FIRST``, as measured with
  ``--durations``), so that no worker is left running one of them alone at the end.
- What shares a worker: tests of a module with a module-scoped fixture (a process started
  once for the module) go to one worker (an ``xdist_group`` per module, under
  ``--dist loadgroup``), so the fixture is set up once, not once per worker.
- Where temporary files go: :func:`base_temp`, not pytest's ``/tmp/pytest-of-<user>``. As
  root, the embedded PostgreSQL runs as the user ``pgserver``, which must be able to reach a
  data directory under a test's ``tmp_path`` (``kenning up``, the chaos run); the wheel opens
  the path's folders to it, but every pytest session that starts on the machine closes
  ``pytest-of-<user>`` again (mode 0700), and the next ``pg_ctl`` fails with "could not
  access directory ... Permission denied".
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests import tiers

WORKERS = 4
SERIAL = "serial"
# the files of the longest tests (20-70 s each under load), longest first
FIRST = (
    "tests/system/test_bench.py",
    "tests/system/test_chaos.py",
    "tests/system/test_docs.py",
    "tests/system/test_up.py",
    "tests/integration/test_ingress_fuzz.py",
    "tests/system/test_e2e.py",
    "tests/system/test_metrics.py",
    "tests/system/test_delivery_processes.py",
    "tests/system/test_tracing.py",
)


KEEP_RUNS = 3  # the latest runs' files are kept for a look after a failure, as pytest does
OWNER = "pid"  # <run>.pid beside each run folder: the PID of its session


def base_temp() -> Path:
    """This session's base temporary directory (pytest's ``--basetemp``): a new folder under
    ``<tmp>/kenning-of-<user>``, beside the ``KEEP_RUNS`` latest earlier ones; older ones whose
    session has ended are removed. The path is no longer than pytest's own: a data directory
    under a test's ``tmp_path`` must leave room for PostgreSQL's socket (107 bytes), which the
    wheel then puts in the data directory, where ``kenning up``'s tests look for it."""
    root = Path(tempfile.gettempdir()) / f"kenning-of-{getpass.getuser()}"
    root.mkdir(exist_ok=True)
    earlier = sorted(root.glob(f"*.{OWNER}"), key=lambda path: path.stat().st_mtime)
    for owner in earlier[: max(0, len(earlier) - KEEP_RUNS)]:
        if not _in_use(owner):
            shutil.rmtree(owner.with_suffix(""), ignore_errors=True)
            owner.unlink(missing_ok=True)
    run = Path(tempfile.mkdtemp(prefix="r", dir=root))  # pytest empties it and makes it its own
    run.with_suffix(f".{OWNER}").write_text(str(os.getpid()))
    return run


def _in_use(owner: Path) -> bool:
    try:
        return bool(psutil.pid_exists(int(owner.read_text())))
    except (OSError, ValueError):
        return False


def workers(config: pytest.Config) -> int:
    """The worker count ``-n auto`` resolves to (0: no workers, the tests run in this process)."""
    from_env = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
    if from_env:
        return int(from_env)
    if config.args_source == pytest.Config.ArgsSource.ARGS and all(_names_tests(arg) for arg in config.args):
        return 0
    if tiers.unit_only(config):
        return 0
    return WORKERS


def _names_tests(arg: str) -> bool:
    """``arg`` names a file or test IDs, not a folder."""
    return "::" in arg or not Path(arg).is_dir()


def longest_first(items: list[pytest.Item]) -> None:
    """Reorder ``items`` so the tests of ``FIRST`` come first, in its order (stable otherwise)."""
    rank = {path: index for index, path in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(FIRST)))


def group_by_module_fixtures(items: list[pytest.Item]) -> None:
    """An ``xdist_group`` mark for each test that uses a module-scoped fixture."""
    for item in items:
        fixtureinfo = getattr(item, "_fixtureinfo", None)
        if fixtureinfo is None or item.get_closest_marker("xdist_group") is not None:
            continue
        definitions = fixtureinfo.name2fixturedefs.values()
        if any(d.scope in ("module", "package", "class") for defs in definitions for d in defs):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))


@contextlib.contextmanager
def turn(lock_dir: Path, *, alone: bool) -> Iterator[None]:
    """Hold this test's turn: shared with other ordinary tests, or ``alone``.

    Readers pass through the turnstile and take the main lock shared; a serial test holds
    the turnstile while it waits for the main lock exclusively, so no new test starts
    meanwhile, and releases the turnstile once it has the main lock.
    """
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / "kenning-turnstile.lock", "a") as turnstile, open(lock_dir / "kenning-turn.lock", "a") as main:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(main, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(main, fcntl.LOCK_UN)
