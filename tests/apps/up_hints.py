"""A small app for ``kenning up --app``: its hints name these workflows."""

from __future__ import annotations

import os

from pydantic import BaseModel

from kenning import App, WorkflowContext, workflow

# The database comes from the App when the environment names none (Edda's EddaApp(name, db_url)).
app = App("up-hints", os.environ.get("KENNING_TEST_APP_DB_URL"))


class Ticket(BaseModel):
    ticket_id: str
    priority: int
    tags: list[str]
    assignee: str = ""


@workflow(event_handler=True, name="ticket.opened")
async def ticket_opened(ctx: WorkflowContext, ticket: Ticket) -> str:
    return ticket.ticket_id


@workflow
async def greet(ctx: WorkflowContext, name: str, times: int = 1) -> str:
    return " ".join([f"hello {name}"] * times)


@workflow
async def tidy_up(ctx: WorkflowContext) -> None:
    return None


@workflow(schedule="0 3 * * *")
async def nightly(ctx: WorkflowContext) -> None:
    return None
