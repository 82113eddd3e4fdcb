"""The replay engine: decides, does no I/O, speaks to the world through one port.

- ``run``: ``WorkflowRun``, one run of a claimed instance (it implements the SDK's
  ``kenning.context.Runtime``);
- ``history``: step ids, the cursor over recorded steps, the determinism checks;
- ``barrier``: a new step waits until every recorded step has been replayed;
- ``retries``: retry decisions, the same for activities and compensations;
- ``heartbeats``: an activity attempt's heartbeats and the deadline they move;
- ``saga``: undoing a saga, newest compensation first;
- ``children``, ``messages``, ``published``, ``streams``: child workflows, messages,
  published values and durable streams, each as steps of a run;
- ``commands`` and ``port``: what the engine asks of its ``InstancePort``;
- ``outcomes``: where a run, and a step's retries, come to rest;
- ``replayonly``: a run over recorded history that writes nothing (``kenning replay-check``).

The worker's PostgreSQL port is ``kenning_worker.port``, the in-memory one
``kenning.testing.memoryport``; the architecture's "Engine shape"
table (docs/architecture.md) says the same, and ``tests/unit/test_engine_layout.py`` holds
both to this folder.
"""
