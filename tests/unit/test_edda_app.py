"""Edda's ``EddaApp`` idioms in one process (issue 27, item 4), without a database: which
database ``wf.start()`` takes, ``initialize()`` with none, and the warning about hooks no
worker will run. ``tests/integration/test_edda_app.py`` starts through it for real."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
import structlog

from kenning import App, ConfigurationError, HooksBase, WorkflowContext, workflow
from kenning.client import close_default_client, default_client
from kenning.registry import REGISTRY
from tests.apps import hooks as module_level_app  # an App with hooks at module level, as workers load it


@workflow(name="edda_app_unit_greet")
async def greet(ctx: WorkflowContext, name: str) -> str:
    return f"hello {name}"


@pytest.fixture(autouse=True)
def no_environment_database(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("KENNING_DATABASE_URL", raising=False)
    yield
    gc.collect()  # the registry holds Apps weakly: each test's Apps are gone before the next one


async def test_the_app_s_db_url_is_the_default_client_s() -> None:
    app = App("edda-main", db_url="postgresql://kenning@127.0.0.1:1/edda")
    await app.initialize()
    assert default_client().database.url.endswith("127.0.0.1:1/edda")
    await app.shutdown()
    assert app in REGISTRY.apps


async def test_the_environment_comes_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KENNING_DATABASE_URL", "postgresql://kenning@127.0.0.1:2/env")
    app = App("edda-main", db_url="postgresql://kenning@127.0.0.1:1/edda")
    assert default_client().database.url.endswith("127.0.0.1:2/env")
    await app.shutdown()


async def test_no_database_at_all_is_one_clear_error() -> None:
    app = App("edda-main")
    with pytest.raises(ConfigurationError, match=r"App.initialize\(\): no database: pass App\(db_url="):
        await app.initialize()
    with pytest.raises(ConfigurationError, match=r"Workflow.start needs a database: make an App\(db_url=...\)"):
        await greet.start(name="x")


async def test_apps_naming_two_databases_leave_the_choice_to_the_caller() -> None:
    first = App("one", db_url="postgresql://kenning:first-secret@127.0.0.1:1/one")
    second = App("two", db_url="postgresql://kenning:second-secret@127.0.0.1:1/two")
    with pytest.raises(ConfigurationError, match="name 2 databases") as raised:
        await greet.start(name="x")
    assert "secret" not in str(raised.value)
    assert first.db_url != second.db_url


async def test_hooks_of_an_app_made_in_a_function_are_reported_once() -> None:
    class Printing(HooksBase):
        pass

    app = App("edda-main", db_url="postgresql://kenning@127.0.0.1:1/edda", hooks=Printing())
    with structlog.testing.capture_logs() as logs:
        default_client()
        await close_default_client()
        default_client()  # a second client: no second warning
        await close_default_client()
    warned = [line for line in logs if line["event"] == "app.hooks_not_loaded"]
    assert [line["service_name"] for line in warned] == ["edda-main"]
    assert warned[0]["log_level"] == "warning" and "kenning worker --app" in warned[0]["hint"]
    # the module-level App with hooks is found by a worker's --app: nothing said of it
    assert module_level_app.app.hooks is not None
    assert app.hooks is not None
