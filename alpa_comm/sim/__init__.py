"""Flow-level network simulation of resharding plans (pure Python)."""
from .network import FluidNetwork, max_min_rates
from .simulate import SimResult, TimelineEntry, simulate

__all__ = ["FluidNetwork", "SimResult", "TimelineEntry", "max_min_rates", "simulate"]
