"""docs/configuration.md is what the settings declarations say (issue 26, item 5): the
generator, run as docs/development.md tells a developer to run it, prints the file as it
is committed; a setting added, renamed or given a new default without regenerating fails."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support import REPO_ROOT


def test_the_configuration_reference_is_generated_from_the_settings() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KENNING_")}
    printed = subprocess.run(
        [sys.executable, "-m", "kenning_devtools.configdoc"],
        env={**env, "PYTHONPATH": str(REPO_ROOT)},
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    committed = (REPO_ROOT / "docs" / "configuration.md").read_text()
    assert printed == committed, (
        "docs/configuration.md is stale: python -m kenning_devtools.configdoc > docs/configuration.md"
    )
    for variable in ("KENNING_WORKER_LEASE_SECONDS", "KENNING_INBOX_RECEIVER_TTL", "KENNING_OVERDUE_SECONDS"):
        assert f"`{variable}`" in committed
