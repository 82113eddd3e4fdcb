"""Operator subcommands of ``kenning``: instances, start, send."""
