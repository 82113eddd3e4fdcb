"""``kenning up``: the whole stack as local OS processes, in one command."""
