"""The weight-sync suite on a cluster of host workers: per-array resharding vs one joint
tree plan vs the joint plan with small leaves coalesced, side by side, every leaf
verified (trees: ``shapes.weight_sync_trees``)."""
from __future__ import annotations

import statistics

import numpy as np

from alpa_comm.placement import Placement, Resharding
from alpa_comm.resharding import plan_resharding
from alpa_comm.resharding.tree import plan_resharding_tree, tree_flatten, tree_unflatten
from alpa_comm.runtime.executor import view
from alpa_comm.sim import simulate
from alpa_comm.topology import ClusterSpec

from . import shapes
from .result import Result, VerificationError, digest

WEIGHT_SYNC_METHODS = ("per_array", "tree_joint", "tree_packed")


def run_weight_sync(cluster, calibrated: ClusterSpec, repeat: int, progress=None, seed: int = 0) -> list[Result]:
    """Every tree of ``shapes.weight_sync_trees`` moved by every one of
    ``WEIGHT_SYNC_METHODS``, ``repeat + 1`` runs each (the first a warm-up)."""
    out = []
    rng = np.random.default_rng(seed)
    src, dst = shapes.WEIGHT_SYNC_SRC, shapes.WEIGHT_SYNC_DST
    for name, tree in shapes.weight_sync_trees().items():
        flat = tree_flatten(tree)
        leaf_paths = [p for p, _ in flat]
        params = [p for _, p in flat]
        xs = [rng.standard_normal(p.shape).astype(np.float32) for p in params]
        arrays = tree_unflatten(tree, [cluster.put(x, src, p.train) for x, p in zip(xs, params)])
        placements = tree_unflatten(tree, [Placement(dst, p.infer) for p in params])
        layouts = tree_unflatten(tree, [Resharding.between(p.shape, "float32", src, p.train, dst, p.infer)
                                        for p in params])
        expected = [{d: digest(view(x, tuple((0, n) for n in p.shape), b))
                     for d, b in Placement(dst, p.infer).resolved(calibrated.devices_per_host)
                     .device_boxes(p.shape).items()}
                    for x, p in zip(xs, params)]
        src_list = [a for _, a in tree_flatten(arrays)]
        nbytes = sum(x.nbytes for x in xs)
        for method in WEIGHT_SYNC_METHODS:
            times, messages = [], 0
            for i in range(repeat + 1):
                if progress:
                    progress(f"weight-sync {name}: {method} run {i + 1}/{repeat + 1}")
                if method == "per_array":
                    results, seconds, predicted = [], 0.0, 0.0
                    for a, p in zip(src_list, params):
                        plan = plan_resharding(a.shape, a.dtype, a.mesh, a.spec, dst, p.infer, cluster=calibrated)
                        results.append(cluster.reshard(a, dst, p.infer, plan=plan))
                        seconds += cluster.last.seconds
                        predicted += simulate(plan).makespan
                    messages = None
                    bound = plan_resharding_tree(layouts, cluster=calibrated, bucket_bytes=None).lower_bound_seconds
                else:
                    bucket = None if method == "tree_joint" else "auto"
                    tplan = plan_resharding_tree(layouts, cluster=calibrated, bucket_bytes=bucket)
                    res_tree = cluster.reshard_tree(arrays, placements, bucket_bytes=bucket)
                    results = [a for _, a in tree_flatten(res_tree)]
                    seconds, predicted = cluster.last.seconds, simulate(tplan).makespan
                    bound = tplan.lower_bound_seconds
                    messages = tplan.messages
                _verify(cluster, name, method, leaf_paths, results, expected)
                if i:
                    times.append(seconds)
            out.append(Result("weight-sync", name, method, "broadcast", "auto", times, statistics.median(times),
                              bound, predicted, nbytes, True,
                              {"leaves": len(flat), "messages": messages,
                               "median_leaf_bytes": int(np.median([x.nbytes for x in xs]))}))
        for a in src_list:
            a.delete()
    return out


def _verify(cluster, name: str, method: str, leaf_paths, results, expected) -> None:
    """Every received leaf's device checksums against the reference, then the leaf freed."""
    for path, r, exp in zip(leaf_paths, results, expected):
        got = cluster.checksums(r)
        bad = sorted(d for d, h in exp.items() if got.get(d) != h)
        if bad:
            raise VerificationError(f"weight-sync {name}, {method}: {path} wrong on devices {bad}")
        r.delete()
