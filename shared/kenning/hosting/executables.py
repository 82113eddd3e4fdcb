"""Finding a system program (``useradd``, ``rabbitmqctl``) that lives in an ``sbin`` folder.

Debian and most distributions install administration programs in ``/usr/sbin`` and
``/sbin``, which only root's login shell puts on ``PATH``: under cron, ``sudo``, ``env -i``,
a container's default ``PATH`` or a user's shell, ``shutil.which("useradd")`` finds nothing
although root can run it. So ``PATH`` first (an operator's own copy wins), then the standard
``sbin`` folders.
"""

from __future__ import annotations

import os
import shutil

SBIN_FOLDERS = ("/usr/local/sbin", "/usr/sbin", "/sbin")


def find_executable(name: str) -> str | None:
    """The path of program ``name``: on ``PATH``, else in a standard ``sbin`` folder; None
    when neither has it."""
    return shutil.which(name) or shutil.which(name, path=os.pathsep.join(SBIN_FOLDERS))
