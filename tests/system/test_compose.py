"""compose.yaml and the Dockerfile: valid, complete, and unable to drift from the CLI."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from tests.support import REPO_ROOT


def test_the_wheel_the_image_installs_holds_every_process(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(REPO_ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("kenning-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for module in (
        "kenning/__init__.py",
        "kenning/py.typed",
        "kenning_worker/main.py",
        "kenning_ingress/main.py",
        "kenning_scheduler/main.py",
        "kenning_relayer/main.py",
        "kenning_console/main.py",
        "kenning_console/templates/base.html",  # the console's templates and static files ship too
        "kenning_console/static/console.css",
        "kenning_devtools/up/main.py",
        "kenning/migrations/env.py",
        "kenning/migrations/versions/0001_initial.py",
        "kenning/storage/instances.py",
        "kenning/commands/send.py",
    ):
        assert module in names, module
    # every subcommand is registered with the wheel, so the image's `kenning worker` finds it
    commands = zipfile.ZipFile(wheel).read("kenning-0.1.0.dist-info/entry_points.txt").decode()
    for name in ("worker", "ingress", "scheduler", "relayer", "migrate", "sink", "up", "bench"):
        assert f"\n{name} = " in commands, name
