"""The process runtime the services share: settings declared once (``config``), the pass
loop, signals and health, the metrics endpoint, retention sweeps, loading ``--app``
modules, the embedded PostgreSQL. Internal: imported by ``kenning.commands`` and the
services, never by the SDK, the engine or storage."""
