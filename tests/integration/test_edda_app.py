"""Edda's ``main()`` on Kenning (issue 27, item 4): ``App(db_url=...)`` made in the program,
then ``wf.start()``, in one process with no ``KENNING_DATABASE_URL``. Before, the start
refused ("Workflow.start needs KENNING_DATABASE_URL"), which 10 of Edda's 12 examples hit."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from kenning import App, Client, WorkflowContext, workflow
from kenning.db import Database


@workflow(name="edda_app_integration_greet")
async def greet(ctx: WorkflowContext, name: str) -> str:
    return f"hello {name}"


@pytest.fixture(autouse=True)
def no_environment_database(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("KENNING_DATABASE_URL", raising=False)
    yield
    gc.collect()  # the registry holds Apps weakly: this test's App is gone before the next test


async def test_app_db_url_reaches_wf_start_in_the_same_process(database_url: str, database: Database) -> None:
    app = App("edda-main", db_url=database_url)
    await app.initialize()
    try:
        first = await greet.start(name="Alice")
        again = await greet.start(name="Bob", instance_id="edda-bob")  # the options mixed in, as Edda's callers do
    finally:
        await app.shutdown()
    async with Client(database=database) as client:
        assert (await client.status(first)).workflow_name == "edda_app_integration_greet"
        assert (await client.status(again)).input == {"name": "Bob"}
