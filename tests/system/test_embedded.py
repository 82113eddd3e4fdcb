"""The embedded PostgreSQL on a new machine: the first uses, side by side, agree on its user,
which they make with the useradd a bare PATH does not find."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import uuid

import pytest

from kenning.hosting.executables import find_executable

# Each process reports once it has imported everything, then waits for the go: the useradd
# runs then start within a millisecond of each other, where the race is.
_FIRST_USE = """
import pwd, sys
from kenning.hosting.embedded import ensure_system_user
print("ready", flush=True)
sys.stdin.readline()
ensure_system_user(sys.argv[1])
print(pwd.getpwnam(sys.argv[1]).pw_uid, flush=True)
"""


@pytest.mark.skipif(os.name != "posix" or os.geteuid() != 0, reason="only root makes the wheel's system user")
def test_first_uses_side_by_side_make_one_system_user() -> None:
    name = f"kt{uuid.uuid4().hex[:10]}"
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", _FIRST_USE, name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # a newcomer's PATH (env -i, cron, a container's): no /usr/sbin, where useradd is
            env={**os.environ, "PATH": "/usr/local/bin:/usr/bin:/bin"},
        )
        for _ in range(6)
    ]
    try:
        for process in processes:
            assert process.stdout is not None
            assert process.stdout.readline().strip() == "ready"
        for process in processes:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        uids = []
        for process in processes:
            out, err = process.communicate(timeout=60)
            assert process.returncode == 0, err
            uids.append(int(out.strip()))
        # one user, and every process saw the uid it ends with: a data directory given to
        # one uid is opened by initdb running as the same one
        assert set(uids) == {pwd.getpwnam(name).pw_uid}
    finally:
        for process in processes:
            process.kill()
            process.wait()
            for pipe in (process.stdin, process.stdout, process.stderr):
                if pipe is not None:
                    pipe.close()
        userdel = find_executable("userdel")
        assert userdel is not None
        subprocess.run([userdel, name], capture_output=True, check=False)
