"""Following durable streams (``write_stream``): the readers of one process.

Every reader of a process waits on the one LISTEN connection of its ``ResultWaits``
(the writes and the instance's end notify ``CHANNEL_RESULTS`` with its id), and the
readers of one stream share a *feed*: one task that reads the stream's new entries once
per wake and keeps the latest ``tail`` of them, which each reader takes from memory. So
1,000 readers of a stream cost one listening connection and one read per wake, not
1,000. A reader first reads from the database on its own (which also tells whether the
instance exists) until it reaches what the feed holds; a reader that falls behind the
feed's tail (a slow consumer) reads from the database again until it catches up.

A feed reads again when its instance is notified, when the listening connection was lost
(it may have missed notifications; every waiter is woken when it is back), every
``poll_interval`` seconds while it does not listen, and every ``FEED_FALLBACK_SECONDS``
while it does (a notification that never came: 1,000 idle streams followed cost 67 reads
a second, not 1,000); it ends at the stream's close, read in the same snapshot as the entries,
so a reader that sees the close has seen every entry.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator

import structlog

from kenning.client.results import ResultWaits
from kenning.core.cancelling import cancel_and_wait, wait_until_set
from kenning.core.streams import StreamEntry, check_stream_key
from kenning.db import Database
from kenning.errors import WorkflowNotFoundError
from kenning.storage import streams as streams_sql

_log = structlog.get_logger("kenning.streams")

# entries one read takes at most
READ_BATCH = 500
# bytes of JSON one read takes at most, past its first entry (a backlog of large entries
# is read in pieces)
READ_BYTES = 4 * 1024 * 1024
# entries a feed keeps for its readers at least (one behind by more reads the database
# itself), and bytes of JSON at most: 1,000 entries of the largest size would be 256 MiB
FEED_TAIL = 1000
FEED_BYTES = 8 * 1024 * 1024
# seconds between a feed's reads with no notification while the connection listens: a
# listening session gets every notification committed, so this read only guards against
# the unforeseen (while it does not listen, the feed reads every ``poll_interval``)
FEED_FALLBACK_SECONDS = 15.0


class _Feed:
    """The shared reader of one stream: its latest entries, contiguous from ``first`` to
    ``end`` (exclusive), and whether the stream is closed or its instance gone."""

    def __init__(self, instance_id: str, key: str, offset: int) -> None:
        self.instance_id = instance_id
        self.key = key
        self.entries: list[StreamEntry] = []  # trimmed to the tail now and then, not per entry
        self.sizes: list[int] = []  # each entry's bytes of JSON
        self.bytes = 0
        self.first = offset  # the offset of entries[0] (== end while empty)
        self.end = offset  # the next offset to read
        self.closed = False
        self.gone = False
        self.changed = asyncio.Event()  # replaced (after being set) at every change
        self.readers = 0
        self.task: asyncio.Task[None] | None = None

    def add(self, read: streams_sql.StreamRead, tail: int, tail_bytes: int) -> None:
        for entry, size in zip(read.entries, read.sizes, strict=True):
            if entry.offset == self.end:
                self.entries.append(entry)
                self.sizes.append(size)
                self.bytes += size
                self.end += 1
        # a copy per ``tail`` entries (or bytes), not a shift per entry
        if len(self.entries) > 2 * tail or self.bytes > 2 * tail_bytes:
            drop = max(0, len(self.entries) - tail)
            kept = sum(self.sizes[drop:])
            while drop < len(self.entries) - 1 and kept > tail_bytes:
                kept -= self.sizes[drop]
                drop += 1
            del self.entries[:drop], self.sizes[:drop]
            self.bytes = kept
        self.first = self.entries[0].offset if self.entries else self.end
        self.closed = read.closed
        self.announce()

    def announce(self) -> None:
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()

    def taken_from(self, offset: int) -> list[StreamEntry]:
        """The entries held from ``offset`` on (``first <= offset``)."""
        return self.entries[offset - self.first :]


class StreamReaders:
    """The stream readers of one client (or one ingress, one console process)."""

    def __init__(
        self,
        database: Database,
        waits: ResultWaits,
        *,
        batch: int = READ_BATCH,
        batch_bytes: int = READ_BYTES,
        tail: int = FEED_TAIL,
        tail_bytes: int = FEED_BYTES,
    ) -> None:
        self.database = database
        self.waits = waits
        self.batch = batch
        self.batch_bytes = batch_bytes
        self.tail = tail
        self.tail_bytes = tail_bytes
        self._feeds: dict[tuple[str, str], _Feed] = {}
        self._closed = False  # close(): readers end where they are

    @property
    def feeds(self) -> int:
        """Streams followed now (one reading task each)."""
        return len(self._feeds)

    async def read(
        self, instance_id: str, key: str, offset: int = 0, *, follow: bool = True, idle: float | None = None
    ) -> AsyncGenerator[StreamEntry | None, None]:
        """The entries from ``offset`` on, in order, each once, ending at the close (with
        ``follow=False``, at the last entry written); with ``idle``, a None after each
        ``idle`` seconds without an entry (a keep-alive for a server's response).
        ``WorkflowNotFoundError`` for an unknown instance."""
        check_stream_key(key)
        if offset < 0:
            raise ValueError(f"a stream's offset is not negative, got {offset}")
        read = await self._read(instance_id, key, offset)
        if read is None:
            raise WorkflowNotFoundError(f"no workflow instance {instance_id!r}")
        while True:  # catching up from the database
            for entry in read.entries:
                yield entry
            if read.entries:
                offset = read.entries[-1].offset + 1
            if not read.more:
                break
            read = await self._read(instance_id, key, offset)
            if read is None:
                return  # deleted meanwhile (retention)
        if read.closed or not follow or self._closed:
            return
        feed = self._join(instance_id, key, offset)
        try:
            async for followed in self._follow(feed, offset, idle):
                yield followed
        finally:
            self._leave(feed)

    async def _follow(self, feed: _Feed, offset: int, idle: float | None) -> AsyncIterator[StreamEntry | None]:
        while True:
            changed = feed.changed
            if offset < feed.first:  # behind the feed's tail: from the database
                read = await self._read(feed.instance_id, feed.key, offset)
                if read is None:
                    return
                for entry in read.entries:
                    yield entry
                if read.entries:
                    offset = read.entries[-1].offset + 1
                elif read.closed:
                    return
                continue
            if offset < feed.end:
                for entry in feed.taken_from(offset):
                    yield entry
                    offset = entry.offset + 1
                continue
            if feed.closed or feed.gone or self._closed:
                return
            if not await wait_until_set(changed, idle if idle is not None else 3600.0) and idle is not None:
                yield None

    async def _read(self, instance_id: str, key: str, offset: int) -> streams_sql.StreamRead | None:
        async with self.database.connection() as conn:
            return await streams_sql.stream_read(
                conn, instance_id, key, offset=offset, limit=self.batch, max_bytes=self.batch_bytes
            )

    def _join(self, instance_id: str, key: str, offset: int) -> _Feed:
        feed = self._feeds.get((instance_id, key))
        if feed is None:
            feed = self._feeds[(instance_id, key)] = _Feed(instance_id, key, offset)
            feed.task = asyncio.create_task(self._run(feed), name=f"kenning-stream-feed:{instance_id}:{key}")
        feed.readers += 1
        return feed

    def _leave(self, feed: _Feed) -> None:
        feed.readers -= 1
        if feed.readers > 0:
            return
        if self._feeds.get((feed.instance_id, feed.key)) is feed:
            del self._feeds[(feed.instance_id, feed.key)]
        if feed.task is not None and not feed.task.done():
            feed.task.cancel()

    async def _run(self, feed: _Feed) -> None:
        """Read the stream's new entries at every wake until it closes."""
        async with self.waits.watching(feed.instance_id) as woken:
            while True:
                woken.clear()  # a notification from now on calls for another read
                try:
                    read = await self._read(feed.instance_id, feed.key, feed.end)
                except Exception as error:  # the database away: the readers wait, the feed tries again
                    _log.warning("streams.read_failed", instance_id=feed.instance_id, key=feed.key, error=repr(error))
                    await asyncio.sleep(self.waits.poll_interval)
                    continue
                if read is None:
                    feed.gone = True
                    feed.announce()
                    return
                feed.add(read, self.tail, self.tail_bytes)
                if read.more:
                    continue
                if read.closed:
                    return
                fallback = FEED_FALLBACK_SECONDS if self.waits.listening else self.waits.poll_interval
                await wait_until_set(woken, max(fallback, self.waits.poll_interval))

    async def close(self) -> None:
        """Stop every feed: their readers end where they are, without the stream's close
        (a server shutting down: its clients resume elsewhere from the last offset)."""
        self._closed = True
        feeds, self._feeds = list(self._feeds.values()), {}
        for feed in feeds:
            feed.gone = True
            feed.announce()
            if feed.task is not None:
                with contextlib.suppress(Exception):
                    await cancel_and_wait(feed.task)
