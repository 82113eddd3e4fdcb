"""The workflows of the benchmark's flow section (``kenning_devtools/bench/flow.py``): a
debounced one, each burst of a key's starts one instance."""

from __future__ import annotations

from kenning import Debounce, WorkflowContext, workflow

# The quiet period: far longer than the time between two back-to-back starts of a burst
# (the bench's CLIENTS keys at a time), shorter than the gap between a key's bursts.
PERIOD = 1.0


@workflow(debounce=Debounce(key="key", period=PERIOD))
async def bench_debounced(ctx: WorkflowContext, key: str, burst: int, n: int) -> int:
    return n
