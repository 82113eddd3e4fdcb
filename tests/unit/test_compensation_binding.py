"""``@on_failure`` compensations are bound as Edda binds them, by name, and one that cannot
be bound is refused when decorated. Running them: ``tests/system/test_compensation_binding.py``."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any, TypedDict

import pytest

from kenning import WorkflowContext, activity, on_failure
from kenning.compensation import on_failure_arguments
from kenning.errors import ConfigurationError
from tests.support import REPO_ROOT


def kenning(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(REPO_ROOT), "KENNING_LOG_FORMAT": "json", "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "kenning", *args],
        capture_output=True,
        text=True,
        env={**env, "KENNING_DATABASE_URL": url},
        cwd=REPO_ROOT,
        timeout=60,
    )


def test_arguments_are_the_activity_parameters_by_name_merged_with_the_result() -> None:
    async def comp(ctx: WorkflowContext, seat: str, reservation_id: str, fare: str) -> None: ...

    async def reserve(ctx: WorkflowContext, seat: str, fare: str = "economy", *rest: str, **extra: str) -> None: ...

    named = on_failure_arguments(reserve, comp, ("12A", "business", "ignored"), {"note": "n"}, {"reservation_id": "r"})
    # every argument by name (positional, defaulted, **extra) and every result key: the
    # compensation picks the ones it declares when it runs, so a deploy may change which
    assert named == {"seat": "12A", "fare": "business", "note": "n", "reservation_id": "r"}
    # Edda merges the result over the arguments
    assert on_failure_arguments(reserve, comp, ("12A",), {}, {"seat": "12B"})["seat"] == "12B"
    assert on_failure_arguments(reserve, comp, ("12A",), {}, "not a dict") == {"seat": "12A", "fare": "economy"}


class Reservation(TypedDict):
    reservation_id: str


class Receipt(TypedDict):
    receipt: str


@pytest.mark.parametrize(
    ("returns", "message"),
    [
        (str, "'reservation_id' is neither a parameter of reserve nor a key of its result (it returns str)"),
        (Receipt, "'reservation_id' is neither a parameter of reserve nor a key of its result (keys: receipt)"),
        (None, "'reservation_id' is neither a parameter of reserve nor a key of its result (it returns None)"),
    ],
)
def test_a_compensation_that_cannot_be_bound_is_refused_when_decorated(returns: Any, message: str) -> None:
    async def cancel(ctx: WorkflowContext, seat: str, reservation_id: str) -> None: ...

    async def reserve(ctx: WorkflowContext, seat: str) -> Any: ...

    reserve.__annotations__["return"] = returns
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        activity(on_failure(cancel)(reserve))
    with pytest.raises(ConfigurationError, match="'reservation_id'"):  # either order of the decorators
        on_failure(cancel)(activity(reserve))


def test_what_decoration_accepts_and_the_other_shapes_it_refuses() -> None:
    async def cancel(ctx: WorkflowContext, seat: str, reservation_id: str, note: str = "") -> None: ...

    async def takes_all(ctx: WorkflowContext, **everything: Any) -> None: ...

    async def positional_only(ctx: WorkflowContext, reservation_id: str, /) -> None: ...

    async def no_ctx() -> None: ...

    async def typed(ctx: WorkflowContext, seat: str) -> Reservation:
        raise NotImplementedError

    async def untyped_dict(ctx: WorkflowContext, seat: str) -> dict[str, str]:
        raise NotImplementedError

    async def unannotated(ctx, seat):  # type: ignore[no-untyped-def]
        ...

    async def open_kwargs(ctx: WorkflowContext, seat: str, **extra: str) -> None: ...

    for act in (typed, untyped_dict, unannotated, open_kwargs):
        on_failure(cancel)(act)  # the key may come from the result or from **extra
    on_failure(takes_all)(typed)
    with pytest.raises(ConfigurationError, match="'reservation_id' is positional-only"):
        on_failure(positional_only)(typed)
    with pytest.raises(ConfigurationError, match="must take the context as its first parameter"):
        on_failure(no_ctx)(typed)
