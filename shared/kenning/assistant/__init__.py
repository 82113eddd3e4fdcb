"""``kenning mcp``: Kenning's operations offered to an AI assistant over the Model
Context Protocol (docs/mcp.md). ``operations`` holds what the tools do, on the reads and
actions the operator commands already use; ``server`` and ``http`` are the MCP side,
imported only by the command (the ``mcp`` extra)."""
