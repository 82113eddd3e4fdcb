"""The turns of ``tests/parallel.py``: ordinary tests run side by side, a serial test runs
alone, and one waiting for its turn is not overtaken by ordinary tests that come later.
(flock locks belong to open files, so threads of one process contend as workers would.)"""

from __future__ import annotations

import pkgutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import tests.apps
from tests import parallel

WAIT = 5.0  # seconds: long enough for a loaded machine, short enough to fail fast


class Turn(threading.Thread):
    """A test's turn taken in a thread, held until ``release`` is set."""

    def __init__(self, lock_dir: Path, *, alone: bool) -> None:
        super().__init__(daemon=True)
        self.lock_dir, self.alone = lock_dir, alone
        self.holding = threading.Event()
        self.release = threading.Event()

    def run(self) -> None:
        with parallel.turn(self.lock_dir, alone=self.alone):
            self.holding.set()
            self.release.wait(WAIT * 2)


def started(turn: Turn) -> Turn:
    turn.start()
    return turn


def test_ordinary_tests_share_a_turn_and_a_serial_one_waits_for_them_and_goes_before_later_ones(
    tmp_path: Path,
) -> None:
    first, second = started(Turn(tmp_path, alone=False)), started(Turn(tmp_path, alone=False))
    assert first.holding.wait(WAIT) and second.holding.wait(WAIT)  # side by side
    serial = started(Turn(tmp_path, alone=True))
    time.sleep(0.2)
    assert not serial.holding.is_set()  # the running tests finish first
    later = started(Turn(tmp_path, alone=False))
    time.sleep(0.2)
    assert not later.holding.is_set()  # not ahead of the serial test waiting for its turn
    first.release.set()
    second.release.set()
    assert serial.holding.wait(WAIT)
    time.sleep(0.2)
    assert not later.holding.is_set()  # nothing runs beside a serial test
    serial.release.set()
    assert later.holding.wait(WAIT)
    later.release.set()
    for turn in (first, second, serial, later):
        turn.join(WAIT)


# Apps that tests only ever load in a process of their own (replay-check runs versions of
# one workflow side by side; kenning up loads its hints app), so their names may repeat.
# pinning_v2 and pinning_v1b: other releases of pinning_v1, each loaded by a worker of its own
LOADED_ALONE = frozenset(
    {"pinning_v1b", "pinning_v2", "replay_extended", "replay_patched", "replay_renamed", "replay_v1", "up_hints"}
)


def test_test_apps_share_one_process_without_a_name_clash() -> None:
    """An xdist worker imports whichever test apps its tests need, in one process: two
    workflows of one name in two apps fail the collection of every module that imports both
    (a child workflow test's ``fan_out`` once hid 40 tests that way)."""
    names = [m.name for m in pkgutil.iter_modules(tests.apps.__path__) if m.name not in LOADED_ALONE]
    script = "import importlib\n" + "".join(f"importlib.import_module('tests.apps.{name}')\n" for name in names)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr.strip().splitlines()[-1:]
