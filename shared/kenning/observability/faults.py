"""Fault points: named places in the engine where a test or a chaos drill crashes or stalls
the process, exactly there.

``KENNING_FAULTS="name=action[,name=action...]"`` arms them for one process, read once at
import. An action is ``crash`` (log ``fault.fired`` at warning, then ``os._exit(137)``, as
``kill -9`` would leave things: no cleanup, no lease released) or ``stall:SECONDS``
(``time.sleep`` in the calling thread, which is the event loop's: the whole process stops,
heartbeats included, as under ``SIGSTOP``). Suffixed ``@N`` it fires once, the N-th time the
point is reached in this process; ``%P`` fires with probability P (0 < P <= 1) each time,
drawn from a ``random.Random`` per point seeded from ``KENNING_FAULTS_SEED`` (default 0) and
the point's name, so a seed replays the same choices whatever the other points do. Bare, it
fires every time. An unknown point or a malformed spec refuses the process at start (one
line on stderr, exit code 2).

Unarmed, ``fault_point`` is one call and one test of an empty dict: it sits on hot paths.
There is no async variant: a stall that blocks one task only is a slow step, which test
code can write itself; the point of a stall here is a process that stops.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import sys
import time
from dataclasses import dataclass, field

import structlog

from kenning.errors import ConfigurationError

FAULTS_VARIABLE = "KENNING_FAULTS"
SEED_VARIABLE = "KENNING_FAULTS_SEED"
CRASH_EXIT_CODE = 137  # what a shell reports for a process killed by SIGKILL

# The points, what has happened when each is reached, and where it is; the names are an
# interface (tests and chaos drills arm them).
POINTS: dict[str, str] = {
    "activity.after_effect": "an activity's function returned, its step not yet recorded (kenning/engine/run.py)",
    "step.after_commit": "a step's record committed, the workflow not yet gone on: a deferred record, a failure, "
    "an activity's or compensation's own transaction (kenning_worker/port.py)",
    "instance.before_release": "the run ended, the statement that releases the lease not yet run: completion and "
    "suspend, the saga's end (kenning_worker/port.py), a hand-back at shutdown or after a crash (worker.py)",
    "relayer.after_send": "a batch was sent and the broker answered, no outcome recorded yet, so no row marked "
    "published (relayer.py)",
    "delivery.after_commit": "an inbox row's transaction committed (event delivered, workflow started, cancel "
    "applied), the worker not yet gone on; not the catch-up of events received before a wait (inbox.py)",
    "source.after_commit": "a broker source's event committed to the inbox, the message not yet acked "
    "(kenning_ingress/sources/base.py)",
    "timer.after_fire": "the scheduler committed fired timers or event timeouts, its next pass not yet begun "
    "(scheduler.py)",
    "cron.tick_decided": "a cron tick's decision written (instance inserted, schedule's row updated), its "
    "transaction not yet committed: the schedule's row is held (kenning_scheduler/cron_ticks.py)",
}
ACTIONS = "crash or stall:SECONDS, optionally suffixed @N (the N-th time, once) or %P (probability P each time)"


@dataclass
class ArmedFault:
    point: str
    action: str  # "crash" or "stall"
    seconds: float = 0.0
    nth: int | None = None
    probability: float | None = None
    rng: random.Random = field(default_factory=random.Random)
    reached: int = 0

    def due(self) -> bool:
        """Whether this time is the one; counts the visit."""
        self.reached += 1
        if self.nth is not None:
            return self.reached == self.nth
        if self.probability is not None:
            return self.rng.random() < self.probability
        return True


def _invalid(spec: str, reason: str) -> ConfigurationError:
    return ConfigurationError(
        f"{FAULTS_VARIABLE}={spec!r} is invalid: {reason}; known points: {', '.join(POINTS)}; actions: {ACTIONS}"
    )


def _number(text: str, spec: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _invalid(spec, f"{what} {text!r} is not a number") from None
    if not math.isfinite(value):
        raise _invalid(spec, f"{what} {text!r} is not a finite number")
    return value


def _parse_action(point: str, text: str, spec: str, seed: int) -> ArmedFault:
    nth: int | None = None
    probability: float | None = None
    if "@" in text:
        text, _, count = text.partition("@")
        if not count.isdigit() or int(count) < 1:
            raise _invalid(spec, f"{point}: @{count} must be a whole number of at least 1")
        nth = int(count)
    elif "%" in text:
        text, _, chance = text.partition("%")
        probability = _number(chance, spec, f"{point}: probability")
        if not 0 < probability <= 1:
            raise _invalid(spec, f"{point}: probability %{chance} must be greater than 0 and at most 1")
    action, _, argument = text.partition(":")
    rng = random.Random(f"{seed}:{point}")
    if action == "crash" and not argument:
        return ArmedFault(point, "crash", nth=nth, probability=probability, rng=rng)
    if action == "stall" and argument:
        seconds = _number(argument, spec, f"{point}: stall")
        if seconds < 0:
            raise _invalid(spec, f"{point}: stall:{argument} must not be negative")
        return ArmedFault(point, "stall", seconds=seconds, nth=nth, probability=probability, rng=rng)
    raise _invalid(spec, f"{point}: unknown action {text!r}")


def parse_faults(spec: str, seed: int = 0) -> dict[str, ArmedFault]:
    """``name=action[,name=action...]`` -> the armed points; ``ConfigurationError`` naming
    the problem and the known points otherwise."""
    armed: dict[str, ArmedFault] = {}
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        point, sep, action = (part.strip() for part in item.partition("="))
        if not sep or not point or not action:
            raise _invalid(spec, f"{item!r} is not name=action")
        if point not in POINTS:
            raise _invalid(spec, f"unknown fault point {point!r}")
        if point in armed:
            raise _invalid(spec, f"{point} is armed twice")
        armed[point] = _parse_action(point, action, spec, seed)
    return armed


def parse_seed(text: str) -> int:
    try:
        return int(text) if text.strip() else 0
    except ValueError:
        raise ConfigurationError(f"{SEED_VARIABLE}={text!r} is invalid: expected a whole number") from None


def _from_environment() -> dict[str, ArmedFault]:
    spec = os.environ.get(FAULTS_VARIABLE, "")
    if not spec.strip():
        return {}
    try:
        return parse_faults(spec, parse_seed(os.environ.get(SEED_VARIABLE, "")))
    except ConfigurationError as error:
        # Read at import, before any entry point could turn this into its usual one-line
        # error: refuse to start here, the same way (one line, exit code 2).
        sys.stderr.write(f"kenning: error: {error}\n")
        sys.stderr.flush()
        raise SystemExit(2) from None


_ARMED: dict[str, ArmedFault] = _from_environment()


def armed() -> dict[str, ArmedFault]:
    """What ``KENNING_FAULTS`` armed in this process (for logs and tests)."""
    return dict(_ARMED)


def fault_point(name: str) -> None:
    """Crash or stall here if ``KENNING_FAULTS`` armed ``name`` and its time has come."""
    if _ARMED:
        fault = _ARMED.get(name)
        if fault is not None and fault.due():
            _fire(fault)


def _fire(fault: ArmedFault) -> None:
    log = structlog.get_logger("kenning.faults")
    log.warning(
        "fault.fired",
        point=fault.point,
        action=fault.action,
        seconds=fault.seconds if fault.action == "stall" else None,
        reached=fault.reached,
        pid=os.getpid(),
    )
    if fault.action == "crash":
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed pipe must not save the process
                stream.flush()
        os._exit(CRASH_EXIT_CODE)  # no cleanup, no finally blocks: as kill -9 leaves things
    time.sleep(fault.seconds)  # the event loop's thread: the whole process stops
    log.info("fault.resumed", point=fault.point, seconds=fault.seconds)
