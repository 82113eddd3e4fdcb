"""``WorkflowContext``: what workflow and activity code sees of the engine."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from kenning.engine.port import StepScope
    from kenning.engine.runtime import Runtime

# The transaction of the activity or compensation attempt running in this task, if any.
current_step: ContextVar[StepScope | None] = ContextVar("kenning_current_step", default=None)


class WorkflowContext:
    """Passed as the first argument to every workflow, activity and compensation."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    @property
    def runtime(self) -> Runtime:
        """The engine's interface for SDK functions (``kenning.engine.runtime``)."""
        return self._runtime

    @property
    def instance_id(self) -> str:
        return self._runtime.instance_id

    @property
    def workflow_name(self) -> str:
        return self._runtime.workflow_name

    @property
    def is_replaying(self) -> bool:
        """True while the workflow is still catching up with recorded history."""
        return self._runtime.is_replaying

    async def patched(self, patch_id: str) -> bool:
        """Change a workflow while old instances finish on the old path (Temporal's
        ``workflow.patched``)::

            if await ctx.patched("reserve-v2"):
                await reserve_v2(ctx, order_id)  # new instances, and those not yet here
            else:
                await reserve(ctx, order_id)  # instances that went past here on the old code

        True on new runs and for instances whose history has the patch's marker (recorded
        the first time it answers True, so replays agree); False for an instance that went
        past this point before the change. Once no instance without the marker is in flight
        (``kenning replay-check`` tells), remove the call and the old path.
        """
        return await self._runtime.patched(patch_id)

    @property
    def session(self) -> AsyncSession:
        """The SQLAlchemy session of the running activity: the same transaction that
        records the activity's result. Outside an activity it raises ``RuntimeError``."""
        step = current_step.get()
        if step is None:
            raise RuntimeError("ctx.session is only available inside an activity or compensation")
        return step.session

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncSession]:
        """A savepoint inside the activity's transaction (Edda's ``ctx.transaction()``)."""
        session = self.session
        async with session.begin_nested():
            yield session

    def __repr__(self) -> str:
        return f"WorkflowContext(instance_id={self.instance_id!r}, workflow_name={self.workflow_name!r})"
