"""The scheduler process: fires timers and event timeouts, starts cron ticks (``kenning scheduler``)."""

from kenning_scheduler.scheduler import Scheduler, SchedulerSettings

__all__ = ["Scheduler", "SchedulerSettings"]
