"""An instance's page stays small whatever the instance holds (issue 25, item 7).

Before, the page rendered every value whole and every recorded step: a 100 MB result made
a 105 MB page and took a console from 80 to 619 MB over four views, 10,000 steps made
8 MB. Now a value over 4 KB is a preview with its size and a download that streams it
from the database, and the history is paged by step number. Against a real
``kenning console`` process; its memory is read with psutil while it serves.
"""

from __future__ import annotations

import hashlib
import html
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import psutil
import psycopg

from tests.console_support import console_ready, spawn_console
from tests.support import ProcessPool

Sql = psycopg.Connection[tuple[object, ...]]
BIG_CHARACTERS = 50_000_000  # 'é' is two bytes in UTF-8: a 100 MB result
PAGE_BOUND = 200_000  # bytes of an instance's page, whatever it holds
MEMORY_BOUND = 60 * 2**20  # the console's growth while it shows and streams 100 MB


@contextmanager
def peak_rss(proc: psutil.Process) -> Iterator[list[int]]:
    """The process's largest resident set size while the block runs (sampled every 20 ms)."""
    peak = [proc.memory_info().rss]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            peak[0] = max(peak[0], proc.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield peak
    finally:
        done.set()
        sampler.join(timeout=5)


def _sha256(sql: Sql, query: str, *params: object) -> str:
    """The SHA-256 of a value's JSON text as PostgreSQL writes it (``query`` selects it as text)."""
    row = sql.execute(f"SELECT encode(sha256(convert_to(({query}), 'UTF8')), 'hex')", list(params)).fetchone()
    assert row is not None and row[0] is not None
    return str(row[0])


async def _download(client: httpx.AsyncClient, url: str) -> tuple[str, int, httpx.Headers]:
    digest, size = hashlib.sha256(), 0
    async with client.stream("GET", url) as answer:
        assert answer.status_code == 200, url
        async for chunk in answer.aiter_bytes():
            digest.update(chunk)
            size += len(chunk)
        return digest.hexdigest(), size, answer.headers


def _links(page: str) -> list[str]:
    return [link.replace("&amp;", "&") for link in re.findall(r'<a href="(/values/[^"]+)" download>', page)]


async def test_a_100_mb_result_is_a_preview_and_a_streamed_download(
    processes: ProcessPool, database_url: str, sql: Sql
) -> None:
    sql.execute(
        "INSERT INTO kenning_instances (id, workflow_name, status, input, result, created_at, updated_at) "
        "VALUES ('big', 'export', 'completed', '{\"rows\": 1}', jsonb_build_object('blob', repeat('é', %s)), "
        "now(), now()), ('small', 'export', 'completed', '{}', '{\"ok\": true}', now(), now())",
        [BIG_CHARACTERS],
    )
    # a step's record and a sent event's data of 1 MB each: previews and downloads too
    sql.execute(
        "INSERT INTO kenning_history (instance_id, step_id, kind, step_name, payload) "
        "VALUES ('big', 'export:1', 'ActivityCompleted', 'export', jsonb_build_object('result', repeat('r', 1000000)))"
    )
    sql.execute(
        "INSERT INTO kenning_outbox (id, instance_id, event_type, source, data) "
        "VALUES (gen_random_uuid(), 'big', 'export.done', '/exports', jsonb_build_object('rows', repeat('d', 1000000)))"
    )
    result_hash = _sha256(sql, "SELECT CAST(result AS text) FROM kenning_instances WHERE id = 'big'")
    url, proc = spawn_console(processes, database_url)
    await console_ready(url, proc)
    console = psutil.Process(proc.pid)
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        assert (await client.get("/instances/small")).status_code == 200  # templates and pools warmed up
        before = console.memory_info().rss
        with peak_rss(console) as viewing:
            pages = [await client.get("/instances/big") for _ in range(4)]
        for page in pages:
            assert page.status_code == 200
            assert len(page.content) < PAGE_BOUND, f"the page is {len(page.content):,} bytes"
        text = pages[0].text
        assert "Too large to show whole: the first 1,024 characters of 100,000,012 bytes" in text
        assert '{"blob": "éééé' in html.unescape(text)
        seq = sql.execute("SELECT seq FROM kenning_history").fetchone()
        assert seq is not None
        links = _links(text)
        assert links[:2] == ["/values/big?of=result", f"/values/big?of=step&key={seq[0]}"]
        assert len(links) == 3 and links[2].startswith("/values/big?of=sent&key=")
        assert viewing[0] - before < MEMORY_BOUND, f"the console grew {(viewing[0] - before) / 2**20:.0f} MB"

        with peak_rss(console) as streaming:
            started = time.monotonic()
            digest, size, headers = await _download(client, links[0])
            took = time.monotonic() - started
        assert (digest, size) == (result_hash, 100_000_012)
        assert headers["content-length"] == "100000012" and headers["content-type"] == "application/json"
        assert headers["content-disposition"] == 'attachment; filename="big-result.json"'
        assert streaming[0] - before < MEMORY_BOUND, f"the console grew {(streaming[0] - before) / 2**20:.0f} MB"
        step_hash = _sha256(sql, "SELECT CAST(payload AS text) FROM kenning_history")
        sent_hash = _sha256(sql, "SELECT CAST(data AS text) FROM kenning_outbox")
        assert (await _download(client, links[1]))[0] == step_hash
        assert (await _download(client, links[2]))[0] == sent_hash
        small = await client.get("/values/small?of=input")
        assert small.content == b"{}"

        missing = await client.get("/values/small?of=step&key=1")
        assert missing.status_code == 404 and "has no such value (step 1)" in missing.text
        wrong = await client.get("/values/small?of=password")
        assert wrong.status_code == 400 and "not a kind of value" in wrong.text
    assert took < 60


async def test_ten_thousand_steps_are_paged_and_every_one_is_reached(
    processes: ProcessPool, database_url: str, sql: Sql
) -> None:
    sql.execute(
        "INSERT INTO kenning_instances (id, workflow_name, status, input, created_at, updated_at, started_at) "
        "VALUES ('long', 'loop', 'running', '{}', now(), now(), now())"
    )
    sql.execute(
        "INSERT INTO kenning_history (instance_id, step_id, kind, step_name, payload, created_at) "
        "SELECT 'long', 'step-' || g, 'ActivityCompleted', 'step-' || g, "
        "jsonb_build_object('result', jsonb_build_object('n', g, 'note', repeat('x', 200))), "
        "now() + g * interval '1 millisecond' FROM generate_series(1, 10000) AS g"
    )
    url, proc = spawn_console(processes, database_url)
    await console_ready(url, proc)
    seen: list[int] = []
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        path: str | None = "/instances/long"
        first = ""
        while path is not None:
            page = await client.get(path)
            assert page.status_code == 200, page.text
            assert len(page.content) < 2_000_000, f"{path} is {len(page.content):,} bytes"
            first = first or page.text
            seen += [int(n) for n in re.findall(r"<strong>step-(\d+)</strong>", page.text)]
            later = re.search(r'<a href="([^"]+)" rel="next">Later steps</a>', page.text)
            path = later[1].replace("&amp;", "&") if later else None
            assert len(seen) <= 10_000, "paging goes round"
        assert seen == list(range(1, 10_001))
        assert "Steps 1–200 of 10,000" in first
        newest_link = re.search(r'<a href="([^"]+)">Newest steps</a>', first)
        assert newest_link is not None
        newest = (await client.get(newest_link[1].replace("&amp;", "&"))).text
        assert "Steps 9,801–10,000 of 10,000" in newest
        assert re.findall(r"<strong>step-(\d+)</strong>", newest)[-1] == "10000"
        earlier = re.search(r'<a href="([^"]+)" rel="prev">Earlier steps</a>', newest)
        assert earlier is not None
        before_newest = (await client.get(earlier[1].replace("&amp;", "&"))).text
        assert "Steps 9,601–9,800 of 10,000" in before_newest
        bad = await client.get("/instances/long?after=x")
        assert bad.status_code == 400 and "not a step number" in bad.text
