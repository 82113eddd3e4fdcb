"""``WorkflowContext``: what workflow and activity code sees of the engine."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

if TYPE_CHECKING:
    from kenning.replay import Replayer


class StepTransaction:
    """The transaction one activity attempt writes in.

    It is opened only when the activity touches ``ctx.session`` or when its result is
    recorded, so an activity doing slow outside I/O holds no connection meanwhile. The
    result, the ``ctx.session`` writes and any outbox rows commit together.
    """

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._session: AsyncSession | None = None
        self._connection: AsyncConnection | None = None
        self._after_commit: list[Callable[[], Awaitable[None]]] = []

    def after_commit(self, callback: Callable[[], Awaitable[None]]) -> None:
        """Run ``callback`` once this transaction has committed (never on rollback)."""
        self._after_commit.append(callback)

    @property
    def session(self) -> AsyncSession:
        if self._session is None:
            self._session = AsyncSession(bind=self._engine, expire_on_commit=False)
        return self._session

    @property
    def in_transaction(self) -> bool:
        """Whether the activity opened the transaction (``ctx.session``, outbox writes)."""
        return self._session is not None or self._connection is not None

    async def connection(self) -> AsyncConnection:
        """The connection of this transaction, begun if it was not yet."""
        if self._session is not None:
            await self._session.flush()
            return await self._session.connection()
        if self._connection is None:
            self._connection = await self._engine.connect()
            await self._connection.begin()
        return self._connection

    async def commit(self) -> None:
        try:
            if self._session is not None:
                await self._session.commit()
            elif self._connection is not None:
                await self._connection.commit()
        finally:
            await self.close()
        callbacks, self._after_commit = self._after_commit, []
        for callback in callbacks:
            await callback()

    async def rollback(self) -> None:
        self._after_commit = []  # rolled back: nothing happened to report
        try:
            if self._session is not None:
                await self._session.rollback()
            elif self._connection is not None:
                await self._connection.rollback()
        finally:
            await self.close()

    async def close(self) -> None:
        session, connection = self._session, self._connection
        self._session = self._connection = None
        if session is not None:
            await session.close()
        if connection is not None:
            await connection.close()


current_step: ContextVar[StepTransaction | None] = ContextVar("kenning_current_step", default=None)


class WorkflowContext:
    """Passed as the first argument to every workflow, activity and compensation."""

    def __init__(self, replayer: Replayer) -> None:
        self._replayer = replayer

    @property
    def instance_id(self) -> str:
        return self._replayer.instance_id

    @property
    def workflow_name(self) -> str:
        return self._replayer.workflow_name

    @property
    def is_replaying(self) -> bool:
        """True while the workflow is still catching up with recorded history."""
        return self._replayer.is_replaying

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
