"""The chaos run's keys phase (issue 35): bursts of starts over many keys into queues with
per-key limits, while the run's faults SIGKILL and SIGSTOP workers and schedulers and
restart PostgreSQL.

Every ``BURST_EVERY`` seconds of the fault window a burst: for each of ``KEYS`` keys,
``PER_KEY`` concurrent starts into ``chaos-keyed-rate`` (``RateLimit(2, 1 s)`` per key,
the key an input field) and as many into ``chaos-newest`` (``cancel_newest``, one open
instance per key). Each start has its own instance id, so a start retried after an
outage returns the instance the first attempt made, never a second one. Then:

- every accepted start landed in exactly one instance: its id exists, of its key;
- every rate-limited one completed (waited, never failed), and no key's one-second window
  held more than 2 starts (``tests/invariants.py::key_rate``);
- every ``chaos-newest`` one completed or was cancelled at its start (said so to the
  caller: ``StartedInstance.cancelled``), and of one key no instance was claimed before
  the one before it had finished: at most one open at a time.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kenning.client import Client
from kenning.starting import StartedInstance
from tests.apps import chaos_keys
from tests.invariants import Sql, key_rate

KEYS = 8
PER_KEY = 3
BURST_EVERY = 4.0
RATE_LIMIT, RATE_PERIOD = 2, 1.0


@dataclass
class KeysFigures:
    bursts: int = 0
    starts: int = 0
    refused_at_start: int = 0  # cancel_newest: said so to the caller
    most_starts_in_a_window: int = 0
    problems: list[str] = field(default_factory=list)


class KeysPhase:
    def __init__(self, url: str, say: Callable[[str], None], seed: int) -> None:
        self.url = url
        self.say = say
        self.rng = random.Random(seed + 35)
        self.started: dict[str, tuple[str, str]] = {}  # instance id -> (workflow, key)
        self.refused: set[str] = set()  # ids a start told were cancelled at once
        self.figures = KeysFigures()

    def expected(self) -> int:
        return len(self.started)

    async def run(self, t0: float, window: float) -> None:
        async with Client(self.url) as client:
            burst = 0
            while time.monotonic() - t0 < window * 0.7:
                await asyncio.sleep(max(0.0, t0 + 1.0 + burst * BURST_EVERY - time.monotonic()))
                starts = []
                for key in range(KEYS):
                    name = f"b{burst}-k{key}"
                    for n in range(PER_KEY):
                        k = f"k{key}"
                        starts.append(self._start(client, chaos_keys.RATED_WORKFLOW, f"rated-{name}-{n}", k, n))
                        starts.append(self._start(client, chaos_keys.NEWEST_WORKFLOW, f"newest-{name}-{n}", k, n))
                self.rng.shuffle(starts)
                await asyncio.gather(*starts)
                burst += 1
                self.say(f"keys burst {burst}: {len(starts)} starts")
            self.figures.bursts = burst

    async def _start(self, client: Client, workflow: str, instance_id: str, key: str, n: int) -> None:
        # the rate-limited queue takes its partition key from the input (RateLimit(key="key"))
        partition_key = key if workflow == chaos_keys.NEWEST_WORKFLOW else None
        while True:
            try:  # the same id again after an outage: the instance the first attempt made
                started: StartedInstance[Any] = await client.start(
                    workflow, instance_id=instance_id, partition_key=partition_key, key=key, n=n
                )
                break
            except Exception as error:
                self.say(f"start {instance_id} failed, retrying: {type(error).__name__}")
                await asyncio.sleep(0.3)
        if started.instance_id != instance_id:
            self.figures.problems.append(f"{instance_id}: the start returned {started.instance_id}")
        if started.cancelled:
            self.refused.add(instance_id)
        self.started[instance_id] = (workflow, key)

    def measure(self, sql: Sql) -> KeysFigures:
        f = self.figures
        f.starts, f.refused_at_start = len(self.started), len(self.refused)
        rows = sql.execute(
            "SELECT id, workflow_name, partition_key, status, error ->> 'reason', started_at, finished_at "
            "FROM kenning_instances WHERE queue_name IN (%s, %s)",
            (chaos_keys.RATED.name, chaos_keys.NEWEST.name),
        ).fetchall()
        found = {str(r[0]): r for r in rows}
        for instance_id, (workflow, key) in self.started.items():
            row = found.get(instance_id)
            if row is None or row[1] != workflow or row[2] != key:
                f.problems.append(f"keys: {instance_id} not one instance of its key: {row}")
                continue
            reason = row[4]
            if workflow == chaos_keys.RATED_WORKFLOW and row[3] != "completed":
                f.problems.append(f"keys: rate-limited {instance_id} ended {row[3]}")
            elif workflow == chaos_keys.NEWEST_WORKFLOW:
                refused = row[3] == "cancelled" and reason == "cancel_newest"
                if refused != (instance_id in self.refused) or row[3] not in ("completed", "cancelled"):
                    f.problems.append(f"keys: {instance_id} ended {row[3]} ({reason}), told cancelled: {refused}")
        if len(found) != len(self.started):
            f.problems.append(f"keys: {len(found)} instances for {len(self.started)} starts")
        try:
            f.most_starts_in_a_window = max(key_rate(sql, chaos_keys.RATED.name, RATE_LIMIT, RATE_PERIOD).values())
        except AssertionError as error:
            f.problems.append(f"keys: a key over its rate limit: {error}")
        ran: dict[str, list[tuple[datetime, datetime | None]]] = {}
        for row in sorted(rows, key=lambda r: (str(r[2]), str(r[5]))):
            if row[1] == chaos_keys.NEWEST_WORKFLOW and row[5] is not None:
                ran.setdefault(str(row[2]), []).append((row[5], row[6]))
        for key, spans in ran.items():
            for (_, before_end), (after_start, _) in itertools.pairwise(spans):
                if before_end is None or after_start <= before_end:
                    f.problems.append(f"keys: two instances of cancel_newest key {key} open at once")
                    break
        return f
