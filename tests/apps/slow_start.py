"""An app that says when a worker imports it (it writes the worker's PID to the file
``KENNING_TEST_IMPORTED_FILE``), then takes ``KENNING_TEST_IMPORT_SECONDS`` to finish
importing (a large application's imports): for the tests of a stop while a worker
starts (tests/system/test_shutdown.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from kenning import App, WorkflowContext, workflow

app = App("kenning-slow-start-tests")

_marker = os.environ.get("KENNING_TEST_IMPORTED_FILE")
if _marker:
    Path(_marker).write_text(str(os.getpid()))
time.sleep(float(os.environ.get("KENNING_TEST_IMPORT_SECONDS", "0")))


@workflow
async def idle(ctx: WorkflowContext) -> None:
    return None
