"""Hosting a Kenning process: what the services share around their work. Settings
declared once (``config``), the pass loop, signals and health, the commit watch, the
metrics endpoint, retention sweeps, loading ``--app`` modules, the embedded PostgreSQL.
Internal: imported by ``kenning.commands`` and the services, never by the SDK, the
engine or storage. Not the SDK's ``kenning.context.Runtime`` (what workflow code calls)."""
