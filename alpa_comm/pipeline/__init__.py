"""Pipeline schedules: IR, generators, validator, memory model, simulator, weight delaying (pure)."""
from .generators import SCHEDULES, compute_order, generate, warmup
from .ir import Action, Schedule, ScheduleError
from .memory import memory
from .simulate import Costs, PipelineResult, simulate_schedule
from .validate import validate
from .weight_delay import auto_delay, auto_delay_schedule

__all__ = ["Action", "Costs", "PipelineResult", "SCHEDULES", "Schedule", "ScheduleError", "auto_delay",
           "auto_delay_schedule", "compute_order", "generate", "memory", "simulate_schedule", "validate", "warmup"]
