"""The MCP server of ``kenning mcp`` (the official ``mcp`` SDK's ``MCPServer``): one tool
per ``Operations`` method, their arguments typed and described for the assistant.

A tool's failure the operator's CLI would state in one line (no such instance, a bad
time, an action refused) is answered the same way: a tool error (``isError``) of one
line, never a traceback. Arguments that break a tool's input schema are answered so
before the tool runs (``ArgumentCheck``), naming the argument.
"""

from __future__ import annotations

import functools
import getpass
import socket
from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Any, Literal

import jsonschema
import structlog
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field

from kenning.assistant.operations import BULK_ACTIONS, MAX_PAGE, Operations, bounded
from kenning.commands.cli import explain
from kenning.commands.steering import Who
from kenning.hosting.presence import kenning_version
from kenning.storage.processes import KINDS

_log = structlog.get_logger("kenning.mcp")

INSTRUCTIONS = (
    "Kenning is a durable workflow engine on PostgreSQL. These tools read its database: search_instances "
    "(by status, workflow, search attributes in `where`, creation time), show_instance (history, waits, "
    "published values, streams, and `why`: what will move it on), list_workers, list_queues, list_schedules, "
    "list_actions (the operator action log) and replay_check. The action tools (cancel, retry, terminate, "
    "skip a compensation, fork from a step, bulk actions, schedule pause/resume/trigger) work only when the "
    "server was started with --allow-actions; a bulk action needs its dry run's confirm_token. Answers are "
    "JSON, bounded: a `truncated` note says how to ask for the rest."
)
_READ = ToolAnnotations(read_only_hint=True, open_world_hint=False)
_ACT = ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False)

InstanceId = Annotated[str, Field(min_length=1, description="the workflow instance's id")]
Limit = Annotated[int, Field(ge=1, le=MAX_PAGE, description=f"rows to answer, 1 to {MAX_PAGE}")]
Time = Annotated[str | None, Field(description="ISO 8601 time, e.g. 2026-01-31T14:00:00Z (UTC without a zone)")]
Reason = Annotated[str, Field(min_length=1, description="why: recorded in the action log")]


def identity(ctx: Context[Any, Any], *, guarded: bool) -> Who:
    """Who the action log records: over HTTP the bearer token (the server's one) or the
    open loopback, and the client's address; over stdio the OS user the server runs as;
    then the MCP client's name as it introduced itself."""
    request = ctx.request_context.request
    client = getattr(getattr(request, "client", None), "host", None)
    if request is not None:
        actor = f"{'bearer-token' if guarded else 'open'}@{client or '?'}"
    else:
        try:
            user = getpass.getuser()
        except (KeyError, OSError):  # no name for this uid (a container's)
            user = "unknown"
        actor = f"{user}@{socket.gethostname()}"
    params = getattr(ctx.session, "client_params", None)
    info = getattr(params, "client_info", None)
    name = getattr(info, "name", None)
    return Who("mcp", f"{actor} ({name})" if name else actor)


def _tool(name: str) -> Callable[[Callable[..., Awaitable[dict[str, Any]]]], Callable[..., Awaitable[str]]]:
    """A tool's body answered as bounded JSON text, its failures as one-line tool errors."""

    def decorate(body: Callable[..., Awaitable[dict[str, Any]]]) -> Callable[..., Awaitable[str]]:
        @functools.wraps(body)
        async def run(*args: Any, **kwargs: Any) -> str:
            try:
                return bounded(await body(*args, **kwargs))
            except Exception as error:
                message, _code = explain(error, debug=True)
                if message.startswith("unexpected error"):  # a bug: the operator needs its traceback
                    _log.error("mcp.tool_crashed", tool=name, exc_info=True)
                else:
                    _log.info("mcp.tool_refused", tool=name, message=message)
                raise ToolError(message) from None

        run.__annotations__ = {**body.__annotations__, "return": str}
        return run

    return decorate


class ArgumentCheck:
    """Server middleware: a ``tools/call`` whose arguments break the tool's input schema
    is answered with one line naming the argument, before pydantic's many-line report."""

    def __init__(self, server: MCPServer[Any]) -> None:
        self.server = server
        self.schemas: dict[str, Mapping[str, Any]] = {}

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.method != "tools/call" or not isinstance(ctx.params, Mapping):
            return await call_next(ctx)
        if not self.schemas:
            self.schemas = {tool.name: tool.input_schema for tool in await self.server.list_tools()}
        name = ctx.params.get("name")
        schema = self.schemas.get(str(name))
        arguments = ctx.params.get("arguments") or {}
        if schema is None:
            return await call_next(ctx)
        error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(arguments))
        if error is None:
            return await call_next(ctx)
        where = ".".join(str(p) for p in error.absolute_path) or "arguments"
        text = f"bad arguments for {name}: {where}: {error.message}"
        text = text if len(text) <= 300 else text[:299] + "…"
        _log.info("mcp.tool_refused", tool=name, message=text)
        return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


def build_server(ops: Operations, *, guarded: bool = False) -> MCPServer[Any]:
    """The server, its tools registered; ``guarded``: a bearer token guards it (HTTP)."""
    server: MCPServer[Any] = MCPServer(name="kenning", version=kenning_version(), instructions=INSTRUCTIONS)
    server._lowlevel_server.middleware.append(ArgumentCheck(server))

    def who(ctx: Context[Any, Any]) -> Who:
        return identity(ctx, guarded=guarded)

    @server.tool(annotations=_READ, structured_output=False)
    @_tool("search_instances")
    async def search_instances(
        status: Annotated[str | None, Field(description="only this status (pending, running, failed, ...)")] = None,
        workflow: Annotated[str | None, Field(description="only this workflow name")] = None,
        where: Annotated[
            dict[str, str | int | float | bool] | None,
            Field(description="search attributes (@workflow(search_attributes=...)) the instance holds, all"),
        ] = None,
        created_after: Time = None,
        created_before: Time = None,
        limit: Limit = 20,
        cursor: Annotated[str | None, Field(description="the next_cursor of the page before")] = None,
    ) -> dict[str, Any]:
        """Find workflow instances, newest first: by status, workflow, search attributes (`where`, e.g.
        {"order": "1042"}) and creation time. Answers a page and a next_cursor."""
        return await ops.search_instances(
            status=status,
            workflow=workflow,
            where=where,
            created_after=created_after,
            created_before=created_before,
            limit=limit,
            cursor=cursor,
        )

    @server.tool(annotations=_READ, structured_output=False)
    @_tool("show_instance")
    async def show_instance(
        instance_id: InstanceId,
        history_after: Annotated[int, Field(ge=0, description="the history's steps after this seq (0: first)")] = 0,
        history_limit: Limit = 50,
    ) -> dict[str, Any]:
        """One instance: status, input, result, error, what it waits for (events, timers), its published
        values, streams and compensations, a page of its history, and `why`: what will move it on, or why
        nothing will."""
        return await ops.show_instance(instance_id, history_after=history_after, history_limit=history_limit)

    @server.tool(annotations=_READ, structured_output=False)
    @_tool("list_workers")
    async def list_workers(
        kind: Annotated[Literal[KINDS] | None, Field(description="only processes of this kind")] = None,  # type: ignore[valid-type]
        live_only: Annotated[bool, Field(description="leave out stale processes")] = False,
    ) -> dict[str, Any]:
        """The fleet's processes (workers, schedulers, relayers, ingresses, consoles): live or stale,
        host, version, the workflows and queues each runs, how busy."""
        return await ops.list_workers(kind=kind, live_only=live_only)

    @server.tool(annotations=_READ, structured_output=False)
    @_tool("list_queues")
    async def list_queues() -> dict[str, Any]:
        """Queues with limits: depth, running, the oldest due one's wait, limits, paused."""
        return await ops.list_queues()

    @server.tool(annotations=_READ, structured_output=False)
    @_tool("list_schedules")
    async def list_schedules() -> dict[str, Any]:
        """Cron schedules: expression, overlap policy, paused (and why), last and next tick, last instance."""
        return await ops.list_schedules()

    @server.tool(annotations=_READ, structured_output=False)
    @_tool("list_actions")
    async def list_actions(
        target: Annotated[str | None, Field(description="only actions on this instance id, queue or schedule")] = None,
        kind: Annotated[str | None, Field(description="only this action (cancel, retry, terminate, ...)")] = None,
        limit: Limit = 20,
        before: Annotated[int | None, Field(ge=1, description="the next_before of the page before")] = None,
    ) -> dict[str, Any]:
        """The operator action log, newest first: who did what, from where (cli, console, mcp), on what."""
        return await ops.list_actions(target=target, kind=kind, limit=limit, before=before)

    @server.tool(annotations=_READ, structured_output=False)
    @_tool("replay_check")
    async def replay_check(
        workflow: Annotated[str | None, Field(description="only this workflow")] = None,
        limit: Annotated[int, Field(ge=1, le=1000, description="in-flight instances to replay at most")] = 50,
        finished: Annotated[int, Field(ge=0, le=MAX_PAGE, description="recent finished ones to replay too")] = 20,
    ) -> dict[str, Any]:
        """Replay in-flight instances against the code the server was started with (--app): which would
        diverge from their recorded history. Reads only."""
        return await ops.replay_check(workflow=workflow, limit=limit, finished=finished)

    @server.tool(annotations=_ACT, structured_output=False)
    @_tool("cancel_instance")
    async def cancel_instance(instance_id: InstanceId, ctx: Context[Any, Any]) -> dict[str, Any]:
        """Cancel one instance: its compensations run, it ends cancelled. Needs --allow-actions."""
        return await ops.act("cancel", instance_id, who(ctx))

    @server.tool(annotations=_ACT, structured_output=False)
    @_tool("retry_instance")
    async def retry_instance(instance_id: InstanceId, ctx: Context[Any, Any]) -> dict[str, Any]:
        """Retry a failed instance from its last good step (or its failed compensations). Needs --allow-actions."""
        return await ops.act("retry", instance_id, who(ctx))

    @server.tool(annotations=_ACT, structured_output=False)
    @_tool("terminate_instance")
    async def terminate_instance(instance_id: InstanceId, reason: Reason, ctx: Context[Any, Any]) -> dict[str, Any]:
        """End one instance now, failed, without compensating. Needs --allow-actions."""
        return await ops.act("terminate", instance_id, who(ctx), reason=reason)

    @server.tool(annotations=_ACT, structured_output=False)
    @_tool("skip_compensation")
    async def skip_compensation(
        instance_id: InstanceId,
        reason: Reason,
        ctx: Context[Any, Any],
        compensation: Annotated[str | None, Field(description="its comp_id (default: the one failing)")] = None,
    ) -> dict[str, Any]:
        """Record a failing compensation as skipped so the saga goes on. Needs --allow-actions."""
        return await ops.act("skip-compensation", instance_id, who(ctx), reason=reason, compensation=compensation)

    @server.tool(annotations=_ACT, structured_output=False)
    @_tool("fork_instance")
    async def fork_instance(
        instance_id: InstanceId,
        from_step: Annotated[
            str,
            Field(
                min_length=1,
                description="the step to run again from: its number in show_instance's history, or its step id",
            ),
        ],
        ctx: Context[Any, Any],
        input: Annotated[
            dict[str, Any] | None, Field(description="keyword arguments in place of the original's input")
        ] = None,
    ) -> dict[str, Any]:
        """A new instance with this one's history before from_step, running today's code from it: the
        steps before it are not run again; the original is left as it is. Needs --allow-actions."""
        return await ops.fork(instance_id, from_step, who(ctx), arguments=input)

    @server.tool(annotations=_ACT, structured_output=False)
    @_tool("bulk_action")
    async def bulk_action(
        action: Annotated[Literal[BULK_ACTIONS], Field(description="what to do to every instance selected")],  # type: ignore[valid-type]
        ctx: Context[Any, Any],
        workflow: Annotated[str | None, Field(description="only this workflow")] = None,
        statuses: Annotated[
            list[str] | None, Field(description="only these statuses (default: all it acts on)")
        ] = None,
        created_after: Time = None,
        created_before: Time = None,
        reason: Annotated[str | None, Field(description="why (terminate: required)")] = None,
        dry_run: Annotated[bool, Field(description="count only, and answer a confirm_token")] = True,
        confirm_token: Annotated[str | None, Field(description="the dry run's token, for the real run")] = None,
    ) -> dict[str, Any]:
        """Cancel, retry or terminate every instance a filter selects, in batches. First a dry run (the
        default): it counts and answers a confirm_token; then the same call with dry_run false and that
        token. Needs --allow-actions."""
        return await ops.bulk(
            action,
            who(ctx),
            statuses=statuses,
            workflow=workflow,
            created_after=created_after,
            created_before=created_before,
            reason=reason,
            dry_run=dry_run,
            confirm_token=confirm_token,
        )

    @server.tool(annotations=_ACT, structured_output=False)
    @_tool("pause_schedule")
    async def pause_schedule(
        name: Annotated[str, Field(min_length=1, description="the scheduled workflow")],
        ctx: Context[Any, Any],
        reason: Annotated[str | None, Field(description="why, shown by list_schedules")] = None,
    ) -> dict[str, Any]:
        """Pause a cron schedule: no tick starts until resumed. Needs --allow-actions."""
        return await ops.schedule("pause", name, who(ctx), reason=reason)

    @server.tool(annotations=_ACT, structured_output=False)
    @_tool("resume_schedule")
    async def resume_schedule(
        name: Annotated[str, Field(min_length=1, description="the scheduled workflow")], ctx: Context[Any, Any]
    ) -> dict[str, Any]:
        """Resume a paused cron schedule, from its next tick. Needs --allow-actions."""
        return await ops.schedule("resume", name, who(ctx))

    @server.tool(annotations=_ACT, structured_output=False)
    @_tool("trigger_schedule")
    async def trigger_schedule(
        name: Annotated[str, Field(min_length=1, description="the scheduled workflow")], ctx: Context[Any, Any]
    ) -> dict[str, Any]:
        """Start one run of a cron schedule now. Needs --allow-actions."""
        return await ops.schedule("trigger", name, who(ctx))

    return server
