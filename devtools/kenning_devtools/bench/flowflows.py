"""The workflows of the benchmark's flow section (``kenning_devtools/bench/flow.py``): a
debounced one, each burst of a key's starts one instance."""

from __future__ import annotations

from kenning import Debounce, WorkflowContext, workflow

# The quiet period: longer than the pace of a key's starts in a burst with the client
# loaded (a start every BURST_SPACING seconds), shorter than the gap between bursts.
PERIOD = 1.0


@workflow(debounce=Debounce(key="key", period=PERIOD))
async def bench_debounced(ctx: WorkflowContext, key: str, burst: int, n: int) -> int:
    return n
