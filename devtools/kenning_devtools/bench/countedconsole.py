"""``kenning console`` with the statements it runs counted, for the bench's console section:
every ``Executor.execute`` (all of the console's SQL goes through it) adds one, and the
count is written to ``KENNING_BENCH_STATEMENTS_FILE`` every ``EVERY_SECONDS``.

    python -m kenning_devtools.bench.countedconsole console --port 8080 --no-migrate
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from typing import Any

from kenning.db.connection import Executor, Rows

EVERY_SECONDS = 0.1
_counted = [0]
_execute = Executor.execute


async def _counting(self: Executor, query: Any, params: Mapping[str, Any] | None = None) -> Rows:
    _counted[0] += 1
    return await _execute(self, query, params)


def _write(path: str) -> None:
    while True:
        with open(path + ".tmp", "w") as out:
            out.write(str(_counted[0]))
        os.replace(path + ".tmp", path)
        time.sleep(EVERY_SECONDS)


def main() -> int:
    from kenning.commands.cli import main as kenning_main

    Executor.execute = _counting  # type: ignore[method-assign]
    threading.Thread(target=_write, args=(os.environ["KENNING_BENCH_STATEMENTS_FILE"],), daemon=True).start()
    return kenning_main()


if __name__ == "__main__":
    raise SystemExit(main())
