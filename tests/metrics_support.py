"""Reading a Prometheus scrape in tests: every sample by name and labels, and a figure."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families

Figures = dict[tuple[str, frozenset[tuple[str, str]]], float]


def figures(text: str) -> Figures:
    """Every sample of a scrape, by name and labels."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(found: Figures, name: str, **labels: str) -> float:
    """The sum of the samples named ``name`` whose labels include ``labels`` (0 if none)."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in found.items() if n == name and wanted <= ls)


async def scrape(url: str) -> Figures:
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.get(url)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return figures(response.text)


async def scrape_until(url: str, condition: Callable[[Figures], bool], message: str, timeout: float = 30) -> Figures:
    """The first scrape that meets ``condition``."""
    deadline = time.monotonic() + timeout
    while True:
        found = await scrape(url)
        if condition(found):
            return found
        assert time.monotonic() < deadline, f"not within {timeout} s: {message}"
        await asyncio.sleep(0.1)
