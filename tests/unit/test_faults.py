"""Fault points (``KENNING_FAULTS``): the parser, where the points are placed, and the
operations guide naming them. The processes crashing at each point:
``tests/system/test_faults.py``."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from kenning.errors import ConfigurationError
from kenning.observability import faults
from kenning.observability.faults import POINTS, fault_point, parse_faults
from tests.logguard import LogGuard
from tests.support import REPO_ROOT


def test_documented_specs_are_parsed() -> None:
    armed = parse_faults(
        " activity.after_effect=crash@2, step.after_commit=stall:0.5 ,relayer.after_send=crash%0.25,"
        "timer.after_fire=stall:1.5%1"
    )
    effect, step, relayer, timer = (
        armed[p] for p in ("activity.after_effect", "step.after_commit", "relayer.after_send", "timer.after_fire")
    )
    assert (effect.action, effect.nth, effect.probability) == ("crash", 2, None)
    assert (step.action, step.seconds, step.nth, step.probability) == ("stall", 0.5, None, None)
    assert (relayer.action, relayer.probability) == ("crash", 0.25)
    assert (timer.action, timer.seconds, timer.probability) == ("stall", 1.5, 1.0)
    assert parse_faults("") == {} and parse_faults(" , ") == {}


def test_at_n_fires_once_on_the_nth_visit_and_bare_fires_every_time() -> None:
    armed = parse_faults("step.after_commit=crash@3,timer.after_fire=crash")
    assert [armed["step.after_commit"].due() for _ in range(5)] == [False, False, True, False, False]
    assert all(armed["timer.after_fire"].due() for _ in range(5))


def test_probability_is_seeded_per_point() -> None:
    def draws(spec: str, seed: int, point: str = "relayer.after_send") -> list[bool]:
        fault = parse_faults(spec, seed)[point]
        return [fault.due() for _ in range(200)]

    first = draws("relayer.after_send=crash%0.3", 7)
    assert first == draws("relayer.after_send=crash%0.3", 7)  # a seed replays the same choices
    assert first != draws("relayer.after_send=crash%0.3", 8)
    assert 20 < sum(first) < 100
    # another point armed beside it changes nothing in this point's draws
    assert first == draws("timer.after_fire=crash%0.5,relayer.after_send=crash%0.3", 7)


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ("activity.after_efect=crash", "unknown fault point 'activity.after_efect'"),
        ("activity.after_effect", "'activity.after_effect' is not name=action"),
        ("activity.after_effect=", "'activity.after_effect=' is not name=action"),
        ("activity.after_effect=explode", "activity.after_effect: unknown action 'explode'"),
        ("activity.after_effect=stall", "activity.after_effect: unknown action 'stall'"),
        ("activity.after_effect=crash:3", "activity.after_effect: unknown action 'crash:3'"),
        ("activity.after_effect=stall:soon", "activity.after_effect: stall 'soon' is not a number"),
        ("activity.after_effect=stall:-1", "activity.after_effect: stall:-1 must not be negative"),
        ("activity.after_effect=stall:inf", "activity.after_effect: stall 'inf' is not a finite number"),
        ("activity.after_effect=crash@0", "activity.after_effect: @0 must be a whole number of at least 1"),
        ("activity.after_effect=crash@x", "activity.after_effect: @x must be a whole number of at least 1"),
        ("activity.after_effect=crash%0", "activity.after_effect: probability %0 must be greater than 0"),
        ("activity.after_effect=crash%1.5", "activity.after_effect: probability %1.5 must be greater than 0"),
        ("activity.after_effect=crash,activity.after_effect=stall:1", "activity.after_effect is armed twice"),
    ],
)
def test_bad_specs_are_refused_naming_the_problem_and_the_points(spec: str, reason: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        parse_faults(spec)
    message = str(raised.value)
    assert message.startswith(f"KENNING_FAULTS={spec!r} is invalid: {reason}")
    assert f"known points: {', '.join(POINTS)}" in message and "\n" not in message


def test_every_point_is_placed_and_every_placement_is_a_known_point() -> None:
    placed: Counter[str] = Counter()
    call = re.compile(r'fault_point\("([^"]*)"\)')
    for folder in ("shared", "services"):
        for path in (REPO_ROOT / folder).rglob("*.py"):
            if path.name != "faults.py":
                placed.update(call.findall(path.read_text()))
    assert set(placed) == set(POINTS), placed


def test_a_stall_logs_fired_and_resumed(monkeypatch: pytest.MonkeyPatch, log_guard: LogGuard) -> None:
    monkeypatch.setattr(faults, "_ARMED", parse_faults("timer.after_fire=stall:0.01@2"))
    with log_guard.capture() as lines:
        for _ in range(3):
            fault_point("timer.after_fire")
            fault_point("step.after_commit")  # not armed
    events = [(line["event"], line.get("point"), line.get("reached")) for line in lines]
    assert events == [("fault.fired", "timer.after_fire", 2), ("fault.resumed", "timer.after_fire", None)]


def armed(point: str) -> dict[str, str]:
    return {"KENNING_FAULTS": f"{point}=crash@1"}


def test_the_operations_guide_names_every_point() -> None:
    operations = (REPO_ROOT / "docs" / "operations.md").read_text()
    assert "KENNING_FAULTS" in operations
    assert [p for p in POINTS if f"`{p}`" not in operations] == []
