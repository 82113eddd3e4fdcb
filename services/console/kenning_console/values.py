"""Values on a page, bounded, and each one whole as a download.

A page shows a value (an input, a result, a step's record, an event's data...) whole up
to ``BOUNDS.bound`` bytes of JSON text; a larger one as its first ``BOUNDS.preview``
characters, its size and a link to ``/values/<instance>?of=<kind>&key=<row>``, which
streams it from the database in chunks (``kenning.storage.console_values``): neither the
page nor the download holds the value in the console's memory. At most
``MAX_DOWNLOADS`` stream at once (each holds a database connection while it runs).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import structlog
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from kenning import codecs
from kenning.errors import ObjectStoreError
from kenning.objects import Reference
from kenning.objects.offload import has_references, store_of
from kenning.objects.store import split_url
from kenning.storage.console import Bounds
from kenning.storage.console_values import SOURCES, value_chunks
from kenning_console.pages import BadRequestError
from kenning_console.state import Console, console_of

_log = structlog.get_logger("kenning.console")

BOUNDS = Bounds(bound=4096, preview=1024)
CHUNK_BYTES = 1 << 20  # one row of the download's statement: what the console holds at a time
MAX_DOWNLOADS = 4


@dataclass(frozen=True)
class Shown:
    """One value as a page shows it: whole (``value``) or as a ``preview`` of its text."""

    value: Any
    size: int  # bytes of its JSON text
    preview: str | None  # None: shown whole
    url: str  # the whole value, as a download

    @property
    def whole(self) -> bool:
        return self.preview is None


def value_url(instance_id: str, of: str, key: object = "") -> str:
    query = {"of": of, **({"key": str(key)} if key != "" else {})}
    return "/values/" + quote(instance_id, safe="/") + "?" + urlencode(query)


def shown(row: Any, name: str, instance_id: str, of: str, key: object = "") -> Shown | None:
    """``row``'s bounded value ``name`` (its ``<name>``, ``<name>_size`` and
    ``<name>_preview`` columns), or None when it has none (SQL NULL)."""
    size = getattr(row, f"{name}_size", None)
    if size is None:
        return None
    # a sealed value is opened with this process's key, and reads "encrypted" without one
    value = codecs.shown(getattr(row, name))
    return Shown(value, int(size), getattr(row, f"{name}_preview"), value_url(instance_id, of, key))


def large(row: Any, name: str, instance_id: str, of: str, key: object = "") -> Shown | None:
    """``row``'s value ``name`` if it is too large to show whole (rows made without the
    bounded columns, as tests make them, have none)."""
    value = shown(row, name, instance_id, of, key)
    return value if value is not None and not value.whole else None


# in a row's JSON text, where the referenced value's bytes go (a string no value holds)
_SPOT = "\u0000kenning-object\u0000"


def _around_reference(value: Any) -> tuple[bytes, Reference, bytes] | None:
    """A row's value that is or holds a reference to the object store (``{"result": {"$ref"...}}``)
    as the JSON text before the referenced value, the reference, and the text after it:
    the row's value whole is ``before + object + after``. None: no reference at its top."""
    whole = Reference.of(value)
    if whole is not None:  # the column is the reference (an input, a published value)
        return b"", whole, b""
    if isinstance(value, dict):
        for name, item in value.items():
            reference = Reference.of(item)
            if reference is not None:
                text = json.dumps({**value, name: _SPOT}, separators=(",", ":"), ensure_ascii=False)
                before, _, after = text.partition(json.dumps(_SPOT))
                return before.encode(), reference, after.encode()
    return None


async def stored_preview(value: Shown) -> Shown:
    """A value whose row holds a reference, as a bounded preview read from the object
    store (a ranged read of its first bytes): the page never fetches the whole value."""
    if not value.whole or not has_references(value.value):
        return value
    around = _around_reference(value.value)
    if around is None:
        return value
    before, reference, after = around
    bucket, key = split_url(reference.url)
    head = b""
    try:
        async for chunk in store_of(bucket).stream(key, limit=BOUNDS.preview):
            head += chunk
    except ObjectStoreError as error:
        return Shown(None, reference.size, f"(the value is in the object store and cannot be read: {error})", value.url)
    if head.startswith(b'{"' + codecs.ENVELOPE_KEY.encode()):  # sealed: its first bytes say nothing
        return Shown(
            None, reference.size, f"({codecs.ENCRYPTED}, {reference.size} bytes in the object store)", value.url
        )
    preview = (before + head).decode(errors="ignore")[: BOUNDS.preview]
    return Shown(None, len(before) + reference.size + len(after), preview, value.url)


async def _object_chunks(reference: Reference, before: bytes, after: bytes) -> AsyncGenerator[tuple[int, bytes], None]:
    """The row's value whole with the referenced value streamed from the object store."""
    bucket, key = split_url(reference.url)
    total = len(before) + reference.size + len(after)
    stream = store_of(bucket).stream(key)
    try:
        first = await anext(stream, b"")  # an unreadable object fails here, before any byte is sent
        yield total, before + first
        async for chunk in stream:
            yield total, chunk
        yield total, after
    finally:
        await stream.aclose()


def _filename(instance_id: str, of: str, key: str) -> str:
    stem = "-".join(part for part in (instance_id, of, key) if part)
    return re.sub(r"[^A-Za-z0-9._-]+", "_", stem)[:150] + ".json"


async def _chunks(console: Console, of: str, instance_id: str, key: str) -> AsyncGenerator[tuple[int, bytes], None]:
    assert console.database is not None, "the console is not started"
    async with console.database.connection() as conn:
        async for pair in value_chunks(conn, of, instance_id, key, chunk=CHUNK_BYTES):
            yield pair


class _Download(StreamingResponse):
    """The streamed value; once sent, or cut short (the client left), its connection goes
    back to the pool and its place among the downloads is freed."""

    def __init__(
        self, head: bytes, chunks: AsyncGenerator[tuple[int, bytes], None], console: Console, **kwargs: Any
    ) -> None:
        self.chunks = chunks
        self.console = console

        async def body() -> AsyncIterator[bytes]:
            yield head
            async for _, chunk in chunks:
                yield chunk

        super().__init__(body(), media_type="application/json", **kwargs)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.console.downloads -= 1
            await self.chunks.aclose()


async def download(request: Request) -> Response:
    """The value whole, as ``application/json``, streamed a chunk at a time."""
    console = console_of(request)
    instance_id = request.path_params["instance_id"]
    of = request.query_params.get("of", "")
    key = request.query_params.get("key", "")
    if of not in SOURCES:
        raise BadRequestError(f"of={of[:50]!r} is not a kind of value: one of {', '.join(SOURCES)}")
    if "\x00" in key or len(key) > 1000:
        raise BadRequestError("key is not a row of this instance")
    if console.downloads >= MAX_DOWNLOADS:
        raise HTTPException(503, f"{console.downloads} downloads are running, the most this console serves at once")
    console.downloads += 1
    chunks = _chunks(console, of, instance_id, key)
    try:
        # the first chunk waits for the value's conversion (about a second per 100 MB)
        async with asyncio.timeout(console.settings.database_timeout * 2):
            first = await anext(chunks, None)
        if first is None:
            which = f"{of} {key}" if key else of
            raise HTTPException(404, f"instance {instance_id!r} has no such value ({which})")
    except BaseException:
        console.downloads -= 1
        await chunks.aclose()
        raise
    total, head = first
    around = _around_reference(_small_json(head)) if total == len(head) else None
    if around is not None:  # the value is in the object store: streamed from there
        await chunks.aclose()
        chunks = _object_chunks(around[1], around[0], around[2])
        try:
            total, head = await anext(chunks)
        except ObjectStoreError as error:
            console.downloads -= 1
            raise HTTPException(502, str(error)) from None
        except BaseException:
            console.downloads -= 1
            raise
    _log.info("console.download", instance_id=instance_id, of=of, key=key or None, bytes=total)
    disposition = f'attachment; filename="{_filename(instance_id, of, key)}"'
    return _Download(head, chunks, console, headers={"content-length": str(total), "content-disposition": disposition})


def _small_json(text: bytes) -> Any:
    """A whole row value read in one chunk, parsed when it may be a reference's row."""
    if len(text) > 4096 or b'"$ref"' not in text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def routes() -> list[BaseRoute]:
    return [Route("/values/{instance_id:path}", download, methods=["GET"])]
