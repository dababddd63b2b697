"""Plans served again: the same resharding planned twice costs one dictionary lookup.

A training loop reshards the same activations every microbatch and an RL job
syncs the same weights every step; planning (decomposition, load balancing, up
to a DFS budget) is paid once. The key is everything the planner reads, after
parsing (so ``"2x4@0,1"`` and the equal ``DeviceMesh`` share an entry): shapes,
dtypes, meshes, specs, the cluster description and every planning option.

Plans are immutable, so a hit hands out the cached object itself (re-labelled
``cache_hit=True`` for ``explain()``). In-process and bounded (least recently
used out first); ``PLAN_CACHE.clear()`` empties it, ``plan_resharding(...,
cache=False)`` bypasses it.
"""
from __future__ import annotations

import dataclasses
import json
import threading
from collections import OrderedDict

from ..placement import Resharding
from ..topology import ClusterSpec

DEFAULT_MAX_PLANS = 256


def move_key(move: Resharding) -> tuple:
    """A hashable key of a resolved move (meshes by their device ids)."""
    s, d = move.src, move.dst
    return (tuple(move.shape), str(move.dtype), s.mesh.shape, s.mesh.devices, s.mesh.devices_per_host, str(s.spec),
            d.mesh.shape, d.mesh.devices, str(d.spec))


def cluster_key(cluster: ClusterSpec) -> str:
    return json.dumps(cluster.to_dict(), sort_keys=True)


class PlanCache:
    """A bounded, thread-safe map from planning inputs to plans, with hit counts."""

    def __init__(self, max_plans: int = DEFAULT_MAX_PLANS):
        self.max_plans = max_plans
        self._plans: OrderedDict[tuple, object] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple):
        """The cached plan, marked as a hit, or None."""
        with self._lock:
            plan = self._plans.get(key)
            if plan is None:
                self.misses += 1
                return None
            self._plans.move_to_end(key)
            self.hits += 1
        return dataclasses.replace(plan, cache_hit=True)

    def put(self, key: tuple, plan) -> None:
        with self._lock:
            self._plans[key] = plan
            self._plans.move_to_end(key)
            while len(self._plans) > self.max_plans:
                self._plans.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._plans.clear()
            self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._plans)

    def stats(self) -> dict:
        return {"plans": len(self), "hits": self.hits, "misses": self.misses, "max_plans": self.max_plans}


PLAN_CACHE = PlanCache()
"""The process's plan cache, used by ``plan_resharding`` and ``plan_resharding_tree``."""


def cache_for(option: "bool | PlanCache | None") -> PlanCache | None:
    """The cache a planner's ``cache=`` option names: True the process's, False/None
    none, or the given one (an empty cache is still a cache)."""
    if option is True:
        return PLAN_CACHE
    return option if isinstance(option, PlanCache) else None
