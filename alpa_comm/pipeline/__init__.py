"""Pipeline schedules: IR, generators, validator, memory model, simulator, weight delaying (pure)."""
from .generators import (DEFAULT_CHUNKS, SCHEDULE_KINDS, SCHEDULE_NAMES, SCHEDULES, V_SCHEDULES, VIRTUAL_SCHEDULES,
                         ScheduleKind, chunks_for, compute_order, dualpipev_order, generate, insert_communication,
                         interleaved_order, lower, place_weight_gradients, schedule_kind, warmup, zbv_order)
from .ir import Action, ActionKind, Schedule, ScheduleError
from .memory import memory
from .simulate import Costs, PipelineResult, simulate_schedule
from .validate import validate
from .weight_delay import auto_backward, auto_delay, auto_delay_schedule

__all__ = ["Action", "ActionKind", "Costs", "DEFAULT_CHUNKS", "PipelineResult", "SCHEDULE_KINDS", "SCHEDULE_NAMES",
           "SCHEDULES", "Schedule", "ScheduleError", "ScheduleKind", "V_SCHEDULES", "VIRTUAL_SCHEDULES",
           "auto_backward", "auto_delay", "auto_delay_schedule", "chunks_for", "compute_order", "dualpipev_order",
           "generate", "insert_communication", "interleaved_order", "lower", "memory", "place_weight_gradients",
           "schedule_kind", "simulate_schedule", "validate", "warmup", "zbv_order"]
