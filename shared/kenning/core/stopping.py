"""A SIGTERM while the ``kenning`` command is still importing is a clean stop (exit code
0), as one while a service starts or runs is (``kenning.hosting.service``), not the
signal's default death (-15). Taken over when this module is imported, the first thing
``import kenning`` does, and only in the ``kenning`` command's own process: a program that imports ``kenning`` keeps
its own SIGTERM. The command hands SIGTERM back (``release``) before it runs the
subcommand, whose service takes it over again, or which dies by it if it is a one-shot
command in the middle of its work."""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType


def _stop(_signum: int, _frame: FrameType | None) -> None:
    # Nothing has started yet: no work to drain, nothing written to flush. Exit here rather
    # than raise SystemExit where the main thread happens to be: raised inside a finalizer
    # or a callback the import was running, it was printed as a traceback and ignored.
    os._exit(0)


def _is_the_kenning_command() -> bool:
    """``python -m kenning ...`` or the ``kenning`` script, told by the interpreter's own
    arguments: a process multiprocessing spawned from it (uvicorn's workers) is given the
    parent's ``sys.argv``, not its ``sys.orig_argv``."""
    given = sys.orig_argv
    by_module = any(given[n : n + 2] == ["-m", "kenning"] for n in range(len(given) - 1))
    script = sys.argv[0] if sys.argv else ""
    return by_module or (os.path.basename(script) == "kenning" and script in given)


def catch_while_importing() -> None:
    """In the ``kenning`` command's process, a SIGTERM from now on exits 0."""
    if not _is_the_kenning_command():
        return
    try:
        signal.signal(signal.SIGTERM, _stop)
    except ValueError:  # not the main thread: not the command's start
        return


def release() -> None:
    """SIGTERM's default back, if ``catch_while_importing`` had taken it."""
    if signal.getsignal(signal.SIGTERM) is _stop:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


catch_while_importing()
