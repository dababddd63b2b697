"""Plans served again: the same resharding planned twice costs one dictionary lookup.

A training loop reshards the same activations every microbatch and an RL job
syncs the same weights every step; planning (decomposition, load balancing, up
to a DFS budget) is paid once. The key is everything the planner reads, after
parsing (so ``"2x4@0,1"`` and the equal ``DeviceMesh`` share an entry): shapes,
dtypes, meshes, specs, the cluster description and every planning option.

A repeated call is served before anything is parsed: the inputs as given (text or
objects: shapes, meshes, specs, the cluster, the options) are an *alias* of the parsed
key (``raw_key``, ``PlanCache.get_alias``), so a hit costs a hash of the inputs, not a
re-resolution of 8,192-device meshes (milliseconds).

Plans are immutable, so a hit hands out the cached object itself (re-labelled
``cache_hit=True`` for ``explain()``). In-process and bounded (least recently
used out first); ``PLAN_CACHE.clear()`` empties it, ``plan_resharding(...,
cache=False)`` bypasses it.

Optionally a cache has a ``store`` that outlives the process (a directory:
``runtime.plan_store.DiskPlanStore``, or ``alpa-comm plan --plan-cache DIR``), so a
job restarted every step plans once per cluster, not once per process. The store is
asked on a memory miss and given every new plan; this module only names entries
(``entry_name``) and never touches files itself.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import operator
import threading
from collections import OrderedDict
from typing import Protocol

from ..placement import Resharding
from ..topology import ClusterSpec

DEFAULT_MAX_PLANS = 256
ALIASES_PER_PLAN = 4
"""Ways of writing the same inputs (text, objects) remembered per cached plan."""


class HashedKey(tuple):
    """A key tuple that hashes once: a tree's keys hold a thousand leaves, and a lookup
    that hashes them again per dictionary operation pays for every leaf each time.
    Equal to, and written (``repr``, so ``entry_name``) as, the plain tuple."""

    def __new__(cls, parts):
        key = super().__new__(cls, parts)
        key._hash = tuple.__hash__(key)
        return key

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        if self is other:
            return True
        if isinstance(other, HashedKey) and self._hash != other._hash:
            return False
        return tuple.__eq__(self, other)

    def __ne__(self, other) -> bool:
        return not self == other


class IdentityKey:
    """Inputs that are the very objects of an earlier call (``same``, compared with
    ``is``) with the rest equal (``equal``): a weight sync that passes the same leaves
    every step is recognised by identity, without hashing or comparing each leaf's
    fields. The key holds its objects, so their ids stay theirs while it is cached.
    Only made for immutable inputs (leaves whose ``raw_key`` hashes)."""

    __slots__ = ("same", "equal", "_hash")

    def __init__(self, same: tuple, equal: tuple):
        self.same, self.equal = same, equal
        self._hash = hash((tuple(map(id, same)), equal))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return (isinstance(other, IdentityKey) and self._hash == other._hash and len(self.same) == len(other.same)
                and all(map(operator.is_, self.same, other.same)) and self.equal == other.equal)


def raw_key(*parts) -> HashedKey | None:
    """A key of planning inputs exactly as the caller gave them (lists made tuples), or
    None where one cannot be hashed. Equal inputs plan alike, so equal raw keys may share
    a plan; different spellings of one resharding get their own alias of the same plan."""
    try:
        return HashedKey(tuple(p) if isinstance(p, list) else p for p in parts)
    except TypeError:
        return None


def move_key(move: Resharding) -> tuple:
    """A hashable key of a resolved move (meshes by their device ids)."""
    s, d = move.src, move.dst
    return (tuple(move.shape), str(move.dtype), s.mesh.shape, s.mesh.devices, s.mesh.devices_per_host, str(s.spec),
            d.mesh.shape, d.mesh.devices, str(d.spec))


def cluster_key(cluster: ClusterSpec) -> str:
    return json.dumps(cluster.to_dict(), sort_keys=True)


def entry_name(key: tuple) -> str:
    """A file-safe name for ``key`` that is the same in every process: a digest of its
    text (keys hold only tuples, strings and numbers) and of the package version, so a
    newer planner never serves an older one's plans."""
    from .. import __version__  # noqa: PLC0415 - the package root imports this module

    return hashlib.sha256(f"{__version__}|{key!r}".encode()).hexdigest()[:40]


class PlanStore(Protocol):
    """Where plans outlive the process: ``load`` returns None for anything it cannot
    read (missing, truncated, from another version), never raises for it."""

    def load(self, name: str): ...

    def save(self, name: str, plan) -> None: ...


class PlanCache:
    """A bounded, thread-safe map from planning inputs to plans, with hit counts, and
    optionally a ``store`` behind it (``store_hits`` counts plans it served)."""

    def __init__(self, max_plans: int = DEFAULT_MAX_PLANS, store: PlanStore | None = None):
        self.max_plans = max_plans
        self.store = store
        self._plans: OrderedDict[tuple, object] = OrderedDict()
        self._aliases: OrderedDict = OrderedDict()  # inputs as given (HashedKey, IdentityKey) -> parsed key
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.store_hits = 0

    def get(self, key: tuple):
        """The cached plan, marked as a hit, or None."""
        with self._lock:
            plan = self._plans.get(key)
            if plan is not None:
                self._plans.move_to_end(key)
                self.hits += 1
                return dataclasses.replace(plan, cache_hit=True)
        plan = self.store.load(entry_name(key)) if self.store is not None else None
        with self._lock:
            if plan is None:
                self.misses += 1
                return None
            self.hits += 1
            self.store_hits += 1
            self._remember(key, plan)
        return dataclasses.replace(plan, cache_hit=True)

    def get_alias(self, raw: HashedKey | IdentityKey | None):
        """The plan cached for inputs given exactly as ``raw`` (``raw_key``), marked as a
        hit, or None (never seen, or its plan has left the cache)."""
        if raw is None:  # ``raw_key`` gives None for inputs it cannot hash
            return None
        with self._lock:
            key = self._aliases.get(raw)
            plan = self._plans.get(key) if key is not None else None
            if plan is None:
                return None
            self._plans.move_to_end(key)
            self._aliases.move_to_end(raw)
            self.hits += 1
            return dataclasses.replace(plan, cache_hit=True)

    def alias_target(self, raw: HashedKey | IdentityKey | None) -> tuple | None:
        """The parsed key ``raw`` is an alias of, or None."""
        if raw is None:
            return None
        with self._lock:
            return self._aliases.get(raw)

    def alias(self, raw: HashedKey | IdentityKey | None, key: tuple) -> None:
        """Remember that inputs given as ``raw`` plan to ``key``."""
        if raw is None or key is None:
            return
        with self._lock:
            self._aliases[raw] = key
            self._aliases.move_to_end(raw)
            while len(self._aliases) > ALIASES_PER_PLAN * self.max_plans:
                self._aliases.popitem(last=False)

    def put(self, key: tuple, plan) -> None:
        with self._lock:
            self._remember(key, plan)
        if self.store is not None:
            self.store.save(entry_name(key), dataclasses.replace(plan, cache_hit=False))

    def _remember(self, key: tuple, plan) -> None:
        self._plans[key] = dataclasses.replace(plan, cache_hit=False)
        self._plans.move_to_end(key)
        while len(self._plans) > self.max_plans:
            self._plans.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._plans.clear()
            self._aliases.clear()
            self.hits = self.misses = self.store_hits = 0

    def __len__(self) -> int:
        return len(self._plans)

    def stats(self) -> dict:
        out = {"plans": len(self), "hits": self.hits, "misses": self.misses, "max_plans": self.max_plans}
        if self.store is not None:
            out["store_hits"] = self.store_hits
        return out


PLAN_CACHE = PlanCache()
"""The process's plan cache, used by ``plan_resharding`` and ``plan_resharding_tree``."""


def cache_for(option: "bool | PlanCache | None") -> PlanCache | None:
    """The cache a planner's ``cache=`` option names: True the process's, False/None
    none, or the given one (an empty cache is still a cache)."""
    if option is True:
        return PLAN_CACHE
    return option if isinstance(option, PlanCache) else None
