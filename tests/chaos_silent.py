"""The chaos run's silent-worker phases (issue 33, item 2): a worker stopped inside its
transaction past its lease, and a worker cut off from PostgreSQL without a reset, each
while its transaction holds an instance's row.

They run after the seeded faults (``tests/chaos_support.py``), on the worker that reaches
PostgreSQL through the run's proxy, and draw nothing from the seed. Each starts a few
``chaos_steps`` instances and has the proxy blackhole that worker at the COMMIT of an
``announce`` step (its outbox row and step record written, the instance row locked, the
commit not arrived); the other workers are SIGSTOPped until then, so that this one, the
farthest from PostgreSQL, claims them. Then:

- **stall**: the worker is SIGSTOPped there, for a lease and 2 s; the cut heals once the
  server has ended the idle session, so only the stop remains;
- **cut**: the worker runs on, unheard, for a lease and 2 s; then the cut heals.

Either way the server ends the worker's idle-in-transaction session (the run's bound, a
half of the lease), and the instances it held must be taken over by another worker while
it is still stopped or cut off; every instance is then accounted for by the run's
verdict like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from typing import TYPE_CHECKING, Any

import psutil

from kenning.client import Client
from tests.apps import chaos as chaos_app
from tests.chaos_schedule import LEASE_SECONDS, PARTITIONED

if TYPE_CHECKING:
    from tests.chaos_support import Chaos, Figures

PHASES = ("stall", "cut")
# The bound the run's processes get (KENNING_DATABASE_IDLE_IN_TRANSACTION_TIMEOUT): at most
# half the lease (as a worker caps its own), so a cut-off session's locks go before its lease does.
IDLE_IN_TRANSACTION_SECONDS = LEASE_SECONDS / 2
SILENT_SECONDS = LEASE_SECONDS + 2.0  # how long the worker stays stopped or cut off
INSTANCES = 12  # started per phase: enough that the proxied worker claims some
REACH_SECONDS = 20.0  # for the worker to reach an announce step's commit

# instances of that worker whose row some transaction locks (claims skip them)
_HELD = (
    "SELECT id FROM kenning_instances WHERE lease_owner = %s AND status IN ('running', 'compensating')"
    " AND id NOT IN (SELECT id FROM kenning_instances WHERE lease_owner = %s FOR UPDATE SKIP LOCKED)"
)
_STILL_HIS = "SELECT id FROM kenning_instances WHERE id = ANY(%s) AND lease_owner = %s"


async def silent_worker_phases(chaos: Chaos, worker_id: str) -> None:
    for phase in PHASES:
        chaos.figures.silent_phases[phase] = await _phase(chaos, phase, worker_id)


async def _phase(chaos: Chaos, phase: str, worker_id: str) -> dict[str, Any]:
    proxy, role = chaos.proxy, chaos.roles[PARTITIONED]
    assert proxy is not None
    outcome: dict[str, Any] = {"reached": False, "held": [], "taken_over": False}
    await _until_up(chaos)
    proxy.blackhole_on(b"COMMIT\x00", after=chaos_app.ANNOUNCED.encode())
    # the other workers, closer to PostgreSQL, would claim the phase's instances first
    others = _pause_others(chaos)
    try:
        async with Client(chaos.url) as client:
            for n in range(INSTANCES):
                await chaos.start(client, "chaos_steps", f"silent-{phase}-{n}", {"n": 10_000 + n})
        deadline = time.monotonic() + REACH_SECONDS
        while not proxy.cut.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
    finally:
        _resume(others)
    if not proxy.cut.is_set():
        proxy.heal()
        chaos.say(f"silent phase {phase}: {PARTITIONED} reached no commit within {REACH_SECONDS} s")
        return outcome
    outcome["reached"] = True
    cut_at = time.monotonic()
    stopped = phase == "stall" and role.proc is not None
    if stopped:
        assert role.proc is not None
        with contextlib.suppress(psutil.NoSuchProcess):
            role.proc.send_signal(signal.SIGSTOP)
    held = [str(r[0]) for r in await chaos._query(_HELD, (worker_id, worker_id))]
    outcome["held"] = held
    chaos.say(f"silent phase {phase}: {PARTITIONED} {'stopped' if stopped else 'cut off'} holding {held}")
    taken_over = False
    while time.monotonic() < cut_at + SILENT_SECONDS:
        if stopped and proxy.cut.is_set() and not await chaos._query(_HELD, (worker_id, worker_id)):
            proxy.heal()  # the server ended the session: what remains is the stop
        if held and not await chaos._query(_STILL_HIS, (held, worker_id)):
            taken_over = True
        await asyncio.sleep(0.1)
    outcome["taken_over"] = taken_over
    outcome["silent_seconds"] = round(time.monotonic() - cut_at, 1)
    proxy.heal()
    if stopped:
        assert role.proc is not None
        with contextlib.suppress(psutil.NoSuchProcess):
            role.proc.send_signal(signal.SIGCONT)
    chaos.say(f"silent phase {phase}: over; held instances taken over meanwhile: {taken_over}")
    return outcome


def _pause_others(chaos: Chaos) -> list[psutil.Popen]:
    """SIGSTOP the other workers that run (each for a few seconds: a seeded fault's kind)."""
    paused = []
    for name, role in chaos.roles.items():
        if name.startswith("worker") and name != PARTITIONED and role.proc is not None and chaos._alive(role):
            with contextlib.suppress(psutil.NoSuchProcess):
                role.proc.send_signal(signal.SIGSTOP)
                paused.append(role.proc)
    return paused


def _resume(paused: list[psutil.Popen]) -> None:
    for proc in paused:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(signal.SIGCONT)


async def _until_up(chaos: Chaos) -> None:
    """Wait (a while) for the proxied worker to run: a seeded kill may have just hit it."""
    role = chaos.roles[PARTITIONED]
    deadline = time.monotonic() + 15.0
    while time.monotonic() < deadline:
        alive = role.proc is not None and role.down_until == 0.0 and chaos._alive(role)
        if alive and '"worker.started"' in chaos._log_of(role):
            return
        await asyncio.sleep(0.1)


def silent_phase_problems(figures: Figures) -> list[str]:
    problems = []
    for phase in PHASES:
        outcome = figures.silent_phases.get(phase)
        if outcome is None or not outcome["reached"]:
            problems.append(f"silent phase {phase}: the worker never reached a commit to be cut at")
        elif not outcome["held"]:
            problems.append(f"silent phase {phase}: the cut-off worker held no locked instance")
        elif not outcome["taken_over"]:
            problems.append(
                f"silent phase {phase}: {outcome['held']} not taken over while the worker was "
                f"{'stopped' if phase == 'stall' else 'cut off'} ({outcome.get('silent_seconds')} s)"
            )
    return problems
