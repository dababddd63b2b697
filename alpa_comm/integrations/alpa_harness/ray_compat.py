"""A pretend Ray cluster: the few Ray driver calls ``alpa.init(cluster="ray")`` makes.

Alpa 0.2.3's ``init`` asks Ray for its nodes (``ray.nodes()``: each node's
``Resources`` with a ``node:<ip>`` key and a GPU count), creates a placement group
(``ray.util.placement_group(...).ready()``, ``ray.wait``) and builds its
``DeviceCluster`` and ``VirtualPhysicalMesh`` from the answers. These functions give
those answers for ``NODES`` (set by ``set_cluster``) so that Alpa's own ``init``,
``DeviceCluster`` and mesh code run unchanged in the harness. Nothing here starts
processes; an actor Alpa would launch remains a catch-all stub.
"""
from __future__ import annotations

import types

from ...errors import InvalidOptionError

NODES: list[dict] = []
_state = {"initialized": False}


def set_cluster(num_hosts: int, gpus_per_host: int, ip_prefix: str = "10.0.0.") -> None:
    """Pretend the Ray cluster has ``num_hosts`` nodes of ``gpus_per_host`` GPUs."""
    NODES[:] = [{"NodeID": f"node{h}", "Alive": True, "NodeManagerAddress": f"{ip_prefix}{h}",
                 "Resources": {"CPU": 8.0, "GPU": float(gpus_per_host), f"node:{ip_prefix}{h}": 1.0}}
                for h in range(num_hosts)]


def is_initialized() -> bool:
    return _state["initialized"]


def init(*args, **kwargs):
    _state["initialized"] = True


def shutdown(*args, **kwargs):
    _state["initialized"] = False


def nodes() -> list[dict]:
    return [dict(n, Resources=dict(n["Resources"])) for n in NODES]


def wait(refs, timeout=None, **kwargs):
    return list(refs), []


def available_resources() -> dict:
    total: dict = {}
    for n in NODES:
        for k, v in n["Resources"].items():
            total[k] = total.get(k, 0.0) + v
    return total


class PlacementGroup:
    """What Alpa reads of a placement group: its bundles and a ready marker."""

    def __init__(self, bundles, strategy="PACK", name=""):
        self.bundle_specs, self.strategy, self.name = [dict(b) for b in bundles], strategy, name

    def ready(self):
        return self


def placement_group(bundles, strategy="PACK", name="", **kwargs) -> PlacementGroup:
    return PlacementGroup(bundles, strategy, name)


def get_placement_group(name):
    raise InvalidOptionError(f"Failed to look up placement group with name: {name}")  # Ray's own words


def get_current_placement_group():
    return None


def remove_placement_group(pg) -> None:
    pass


TOP = ("is_initialized", "init", "shutdown", "nodes", "wait", "available_resources")
UTIL = ("placement_group", "get_placement_group", "get_current_placement_group", "remove_placement_group")


def populate(module: types.ModuleType) -> None:
    """Give a ``ray``, ``ray.util`` or ``ray.util.placement_group`` stub module the calls above."""
    names = {"ray": TOP, "ray.util": UTIL, "ray.util.placement_group": UTIL + ("PlacementGroup",)}
    for n in names.get(module.__name__, ()):
        setattr(module, n, globals()[n])


class RayUtilModule(types.ModuleType):
    """``ray.util``: as in Ray, its ``placement_group`` attribute stays the *function*
    even after the submodule of that name is imported (Alpa calls it)."""

    def __setattr__(self, name, value):
        if name == "placement_group" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)
