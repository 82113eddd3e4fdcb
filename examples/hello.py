"""The README's first example: a three-step workflow run by a separate worker process.

kenning worker --app examples.hello      # in one terminal
python -m examples.hello Ada             # in another: starts one and prints its result
"""

from __future__ import annotations

import asyncio
import sys

from kenning import Client, WorkflowContext, activity, workflow


@activity
async def greet(ctx: WorkflowContext, name: str) -> str:
    return f"Hello, {name}"


@activity
async def shout(ctx: WorkflowContext, text: str) -> str:
    return text.upper() + "!"


@workflow
async def hello(ctx: WorkflowContext, name: str) -> str:
    greeting = await greet(ctx, name)  # recorded once; replayed after a crash
    return await shout(ctx, greeting)


async def main(name: str) -> None:
    async with Client() as client:  # KENNING_DATABASE_URL
        started = await client.start(hello, name=name)
        print(started.instance_id, await client.result(started.instance_id, timeout=30))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "world"))
