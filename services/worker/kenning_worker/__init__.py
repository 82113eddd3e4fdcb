"""The worker process: claims runnable instances and replays them (``kenning worker``)."""

from kenning_worker.worker import Worker, WorkerSettings

__all__ = ["Worker", "WorkerSettings"]
