"""Fuzzing the ingress: whatever a client sends, the answer is a 2xx or a JSON 4xx, the
app raises nothing and logs nothing at error level (the log guard checks that).

Two layers, both in-process and fast: the CloudEvents parser alone (every outcome is an
event or an ``InvalidEventError``, and an accepted event is within the limits and
storable), and the Starlette app on a real database through httpx's ASGI transport
(binary-mode headers, structured and batched bodies, percent-encoded paths). For long
runs, ``scripts/fuzz_ingress.py`` drives the parser with atheris.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote_from_bytes

import httpx
import pytest
from hypothesis import event as label
from hypothesis import given
from hypothesis import strategies as st

from kenning_ingress import IngressSettings, create_app
from tests.ingress_fuzz_strategies import (
    FUZZ,
    requests,
)


class AppUnderTest:
    """The ingress app, started once on its own event loop, called example by example."""

    def __init__(self, database_url: str) -> None:
        self.runner = asyncio.Runner()
        self.app = create_app(IngressSettings(database_url=database_url))
        self._stack = contextlib.AsyncExitStack()
        self.http: httpx.AsyncClient | None = None

    def __enter__(self) -> AppUnderTest:
        async def start() -> None:
            await self._stack.enter_async_context(self.app.router.lifespan_context(self.app))
            transport = httpx.ASGITransport(app=self.app)  # raises whatever the app raises
            self.http = await self._stack.enter_async_context(
                httpx.AsyncClient(transport=transport, base_url="http://ingress")
            )

        self.runner.run(start())
        return self

    def __exit__(self, *exc: object) -> None:
        self.runner.run(self._stack.aclose())
        self.runner.close()

    def request(self, method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes) -> httpx.Response:
        assert self.http is not None
        return self.runner.run(self.http.request(method, path, headers=headers, content=body))


@pytest.fixture
def app(database_url: str) -> Iterator[AppUnderTest]:
    with AppUnderTest(database_url) as started:
        yield started


def assert_json_answer(response: httpx.Response) -> dict[str, Any]:
    assert 200 <= response.status_code < 300 or 400 <= response.status_code < 500, (
        response.status_code,
        response.text,
    )
    answer: dict[str, Any] = response.json()
    if response.status_code >= 400:
        assert set(answer) == {"error", "error_type", "retryable"}, answer
        assert answer["retryable"] is False
    return answer


@FUZZ
@given(request=requests)
def test_any_event_request_gets_2xx_or_a_json_4xx(app: AppUnderTest, request: tuple[Any, bytes]) -> None:
    headers, body = request
    response = app.request("POST", "/", headers, body)
    assert_json_answer(response)
    label(f"HTTP {response.status_code}")  # --hypothesis-show-statistics: how many got through


@FUZZ
@given(
    raw_id=st.one_of(st.binary(max_size=20), st.sampled_from([b"\x00", b"a\x00", b"\xff\xfe", b"x" * 1100])),
    route=st.sampled_from([("GET", "/instances/"), ("POST", "/cancel/")]),
    query=st.binary(max_size=8),
)
def test_percent_encoded_instance_ids_get_json(
    app: AppUnderTest, raw_id: bytes, route: tuple[str, str], query: bytes
) -> None:
    method, prefix = route
    path = prefix + quote_from_bytes(raw_id, safe="") + "?q=" + quote_from_bytes(query, safe="")
    response = app.request(method, path, [], b"")
    answer = assert_json_answer(response)
    if raw_id and response.status_code >= 400:
        assert answer["error_type"] in ("not_found", "invalid_request"), answer
