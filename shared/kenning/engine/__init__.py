"""The replay engine: decides, does no I/O, speaks to the world through one port.

- ``history``: step ids, the cursor over recorded steps, the determinism checks;
- ``barrier``: a new step waits until every recorded step has been replayed;
- ``retries``: retry decisions, the same for activities and compensations;
- ``run``: ``WorkflowRun``, one run of a claimed instance (the SDK's ``Runtime``);
- ``saga``: undoing a saga, newest compensation first;
- ``commands`` and ``port``: what the engine asks of its ``InstancePort``;
- ``runtime``: the interface SDK functions use (``ctx.runtime``);
- ``memory``: an in-memory port, for tests without a database.

The worker's PostgreSQL port is ``kenning_worker.port``.
"""
