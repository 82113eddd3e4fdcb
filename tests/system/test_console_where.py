"""The console's ``where=`` filter reads a search attribute as ``kenning instances list
--where`` does (issue 33, item 6): one ``KEY=VALUE`` per parameter, split at the first
``=``, the value kept as typed, so a value holding commas and spaces is found, by the
console and the CLI alike; several parameters must all hold, and the page's links keep
them. Through a real ``kenning console`` process over HTTP, no browser.

Before, the console split its one ``where`` field on commas and stripped spaces, so
``customer=Doe, Jane`` asked for a customer ``Doe`` and an attribute `` Jane``.
"""

from __future__ import annotations

import json
import re

import httpx

from kenning import Client
from kenning.db import Database
from tests.apps import published
from tests.console_support import console_ready, spawn_console
from tests.support import ProcessPool
from tests.support import kenning_command as kenning

DOE_JANE = "Doe, Jane"
EU_WEST = "eu west, 2"


def _ids(html: str) -> list[str]:
    return re.findall(r'<td class="id" data-label="Instance"><a href="[^"]+">([^<]+)</a>', html)


def _next(html: str) -> str | None:
    found = re.search(r'<a href="([^"]+)" rel="next">', html)
    return found.group(1).replace("&amp;", "&") if found else None


async def test_where_values_with_commas_and_spaces_are_found_as_the_cli_finds_them(
    processes: ProcessPool, database: Database, database_url: str
) -> None:
    async with Client(database=database) as client:
        for instance_id, customer, region in (
            ("jane-1", DOE_JANE, EU_WEST),
            ("jane-2", DOE_JANE, EU_WEST),
            ("jane-us", DOE_JANE, "us"),
            ("doe", "Doe", "eu west"),
        ):
            attributes = {"customer": customer, "region": region}
            await client.start(
                published.published_order.options(instance_id=instance_id, search_attributes=attributes),
                customer=customer,
                region=region,
            )
    url, proc = spawn_console(processes, database_url, env={"KENNING_CONSOLE_PAGE_SIZE": "1"})
    await console_ready(url, proc)

    def cli(*where: str) -> list[str]:
        flags = [arg for pair in where for arg in ("--where", pair)]
        listed = kenning("instances", "list", *flags, "--json", url=database_url)
        assert listed.returncode == 0, listed.stderr
        return [row["id"] for row in json.loads(listed.stdout)]

    async with httpx.AsyncClient(base_url=url, timeout=10) as http:

        async def console(*where: str) -> list[str]:
            """Every id the console lists for ``where``, page after page (one row a page)."""
            found: list[str] = []
            response = await http.get("/instances", params=[("where", pair) for pair in where])
            while True:
                assert response.status_code == 200, response.text
                found += _ids(response.text)
                following = _next(response.text)
                if following is None:
                    return found
                response = await http.get(following)

        for where in (
            (f"customer={DOE_JANE}",),
            (f"customer={DOE_JANE}", f"region={EU_WEST}"),
            ("customer=Doe",),
            ("region=eu west",),
            ("region=eu",),
        ):
            assert await console(*where) == cli(*where), where
        assert await console(f"customer={DOE_JANE}") == ["jane-us", "jane-2", "jane-1"]
        assert await console(f"customer={DOE_JANE}", f"region={EU_WEST}") == ["jane-2", "jane-1"]
        assert await console("customer=Doe") == ["doe"]
        assert await console("region=eu") == []

        shown = await http.get("/instances", params=[("where", f"customer={DOE_JANE}"), ("where", "")])
        assert 'value="customer=Doe, Jane"' in shown.text  # the form keeps the pair as typed

        for bad, says in (
            ("customer", "is not KEY=VALUE"),
            ("=x", "is not KEY=VALUE"),
            ("customer=a\x00b", "NUL"),
        ):
            refused = await http.get("/instances", params={"where": bad})
            assert refused.status_code == 400 and says in refused.text, (bad, refused.text)
        twice = await http.get("/instances", params=[("where", "customer=a"), ("where", "customer=b")])
        assert twice.status_code == 400 and "named twice" in twice.text
