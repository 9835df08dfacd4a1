"""Schedulers decide, each step, which requests run and how many tokens each brings."""

from minillm.scheduler.base import Scheduler
from minillm.scheduler.continuous import ContinuousScheduler
from minillm.scheduler.output import ScheduledChunk, SchedulerOutput
from minillm.scheduler.static import StaticScheduler

__all__ = ["ContinuousScheduler", "ScheduledChunk", "Scheduler", "SchedulerOutput", "StaticScheduler"]
