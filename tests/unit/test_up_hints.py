"""The commands ``kenning up`` suggests: built from each workflow's parameters, and never
the reason ``up`` stops (a hint is built after every process is ready)."""

from __future__ import annotations

import enum
import json
import shlex
from collections.abc import Awaitable, Callable

from pydantic import BaseModel

from kenning import App, WorkflowContext
from kenning.registry import Registry
from kenning.workflow import Workflow
from kenning_devtools.up.hints import hints, sample_input


class Node(BaseModel):
    """A tree: the model contains itself."""

    name: str
    children: list[Node]
    parent: Node | None


class Team(BaseModel):
    lead: Person
    members: list[Person]


class Person(BaseModel):
    """Mutually recursive with ``Team``."""

    name: str
    team: Team | None


Node.model_rebuild()
Team.model_rebuild()


class Nothing(enum.Enum):
    """No member: no value can be suggested (sampling it raises StopIteration)."""


async def tree(ctx: WorkflowContext, root: Node) -> None:
    return None


async def org(ctx: WorkflowContext, team: Team, size: int) -> None:
    return None


async def empty_choice(ctx: WorkflowContext, choice: Nothing) -> None:
    return None


def app_of(*funcs: Callable[..., Awaitable[None]]) -> App:
    registry = Registry()
    for func in funcs:
        registry.add_workflow(Workflow(func))
    return App("hints", registry=registry)


def test_a_model_that_contains_itself_gets_a_finite_sample() -> None:
    """Before, sampling ``children: list[Node]`` recursed until RecursionError, which
    stopped ``kenning up`` after every process was ready."""
    assert sample_input(tree) == {"name": "...", "children": [], "parent": None}
    team = {"lead": {"name": "...", "team": None}, "members": [{"name": "...", "team": None}]}
    assert sample_input(org) == {"team": team, "size": 0}


def test_hints_for_recursive_models_are_commands_with_their_sample() -> None:
    (org_hint, tree_hint) = hints(app_of(tree, org))
    assert shlex.split(tree_hint)[:3] == ["kenning", "start", "tree"]
    assert json.loads(shlex.split(tree_hint)[4]) == {"name": "...", "children": [], "parent": None}
    assert shlex.split(org_hint)[2] == "org"


def test_a_type_that_cannot_be_sampled_for_any_reason_gets_a_placeholder() -> None:
    assert hints(app_of(empty_choice, tree))[0] == "kenning start empty_choice --input '{...}'"
