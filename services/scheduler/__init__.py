"""The scheduler process: fires timers and event timeouts, starts cron ticks (``kenning scheduler``)."""

from kenning.scheduler.scheduler import Scheduler, SchedulerSettings

__all__ = ["Scheduler", "SchedulerSettings"]
