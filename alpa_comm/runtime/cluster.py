"""The driver API: ``Cluster`` (a Ray cluster with one ``HostWorker`` per host) and
``DistributedArray`` (a tensor sharded over a device mesh of that cluster).

    with Cluster.emulated(5, 4, nic="400mbit") as cluster:
        a = cluster.put(x, "2x4@0,1", "S0RR")
        b = cluster.reshard(a, "2x4@2,3", "RS0R", strategy="broadcast")
        assert (b.gather() == x).all()

Meshes and specs are taken as objects or in the CLI's text forms. Everything
is checked before a byte moves; every wait has a timeout, and a failure in
the middle of a transfer raises ``CommunicationError`` naming the host.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

import numpy as np

from ..errors import InvalidArgumentError, InvalidTypeError
from ..mesh import DeviceMesh
from ..placement import Placement, Resharding, check_fits
from ..resharding import plan_resharding
from ..resharding.host_job import HostJob
from ..resharding.plan import ReshardingPlan
from ..resharding.strategies import carries_data
from ..spec import ShardingSpec
from ..topology import ClusterSpec
from ..validation import one_of
from .backend import CommunicationError
from .emulated.launch import restore_env, teardown_emulated
from .executor import numpy_dtype, view
from .launch import ClusterLaunchers
from .worker import TRANSPORTS, HostWorker


@dataclass
class ReshardStats:
    """What the last reshard took: wall time between the hosts' start (after a barrier)
    and the last host's end, and the plan that ran."""

    seconds: float
    plan: ReshardingPlan
    per_host: dict[int, dict] = field(default_factory=dict)


class DistributedArray:
    """A tensor sharded over ``mesh`` with ``spec``; data lives in the host workers."""

    def __init__(self, cluster: "Cluster", array_id: str, shape, dtype: str, mesh: DeviceMesh, spec: ShardingSpec,
                 has_data: bool = True):
        self.cluster, self.id, self.shape, self.dtype = cluster, array_id, tuple(shape), dtype
        self.mesh, self.spec, self.has_data = mesh, spec, has_data

    def __repr__(self) -> str:
        return f"DistributedArray({'x'.join(map(str, self.shape))} {self.dtype}, {self.spec} on {self.mesh.label()})"

    @property
    def placement(self) -> Placement:
        return Placement(self.mesh, self.spec)

    def shards(self) -> dict[int, np.ndarray]:
        """Every device's buffer, fetched to the driver."""
        if not self.has_data:
            raise CommunicationError("this array came from the 'signal' strategy, which moves one byte per task "
                                     "and no data")
        return self.cluster._fetch(self)

    def gather(self) -> np.ndarray:
        """The whole tensor, assembled on the driver from one replica of every shard."""
        out = np.empty(self.shape, numpy_dtype(self.dtype))
        full = tuple((0, n) for n in self.shape)
        boxes = self.placement.device_boxes(self.shape)
        for d, buf in self.shards().items():
            view(out, full, boxes[d])[...] = buf
        return out

    def delete(self) -> None:
        self.cluster._delete(self)


class Cluster(ClusterLaunchers):
    """A Ray cluster with one ``HostWorker`` per host. Start one with ``open``, ``local``,
    ``connect`` or ``emulated`` (``launch.ClusterLaunchers``)."""

    worker_class = HostWorker  # subclasses put richer workers on the hosts (pipeline stages)

    def __init__(self, spec: ClusterSpec, workers: list, timeout: float, network=None, owns_ray: bool = True):
        self.spec, self.workers, self.timeout = spec, workers, timeout
        self.network, self.owns_ray = network, owns_ray
        self.last: ReshardStats | None = None
        self._saved_env: dict[str, str | None] = {}
        self.broken: str | None = None
        self.closed = False
        self.transports = {"gloo"}  # joined by every host (``join_transport``)

    # --------------------------------------------------------------- waiting
    def _wait(self, refs: list[tuple], what: str, timeout: float | None = None) -> list:
        """Results of (object ref, host) calls, in host order; the first failure raises
        ``CommunicationError`` naming its host, a missing answer names the silent hosts."""
        import ray  # noqa: PLC0415

        timeout = self.timeout + 10.0 if timeout is None else timeout
        host_of_ref = {r: h for r, h in refs}
        pending = list(host_of_ref)
        results = {}
        deadline = time.monotonic() + timeout
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                silent = sorted(host_of_ref[r] for r in pending)
                self.broken = f"host(s) {silent} did not finish {what}"
                raise CommunicationError(f"host(s) {silent} did not finish {what} within {timeout:g} s")
            r = ready[0]
            try:
                results[host_of_ref[r]] = ray.get(r)
            except ray.exceptions.RayActorError as e:
                h = host_of_ref[r]
                self.broken = f"host {h}'s worker died"
                raise CommunicationError(f"host {h}: its worker process died while {what}: "
                                         f"{str(e).splitlines()[0]}") from e
            except ray.exceptions.RayTaskError as e:
                h = host_of_ref[r]
                self.broken = f"host {h} failed"
                cause = e.cause if isinstance(getattr(e, "cause", None), Exception) else e
                raise CommunicationError(f"host {h} failed while {what}: {cause}") from e
        return [results[h] for h in sorted(results)]

    def _check_usable(self) -> None:
        if self.closed:
            raise CommunicationError("the cluster was shut down")
        if self.broken:
            raise CommunicationError(f"the cluster is unusable after a failure ({self.broken}); shut it down and "
                                     "start a new one")

    def join_transport(self, name: str) -> None:
        """Every host joins transport ``name`` beside gloo, once (``HostWorker.join_transport``)."""
        one_of(name, TRANSPORTS, "transport")
        self._check_usable()
        if name not in self.transports:
            # each host's connections paced at its NIC's rate (``TcpBackend``'s pace_gbps), as
            # ``alpa_comm.jax`` groups do: unpaced, connections leaving one host overflow its queue
            self._wait([(w.join_transport.remote(name, self.timeout, self.spec.send_rate(h) * 8 / 1e9), h)
                        for h, w in enumerate(self.workers)], f"joining the {name} transport")
            self.transports.add(name)

    # ---------------------------------------------------------------- arrays
    def _mesh(self, mesh) -> DeviceMesh:
        m = DeviceMesh.parse(mesh, self.spec.devices_per_host)
        check_fits(m, self.spec)
        return m

    def put(self, array: np.ndarray, mesh, spec) -> DistributedArray:
        """Shard ``array`` over ``mesh`` with ``spec`` (every replica gets a copy)."""
        self._check_usable()
        array = np.asarray(array)
        m, s = self._mesh(mesh), ShardingSpec.parse(spec)
        s.validate(array.shape, m.shape)
        from ..dtypes import dtype_name  # noqa: PLC0415

        dtype = dtype_name(array.dtype)
        full = tuple((0, n) for n in array.shape)
        per_host: dict[int, dict[int, np.ndarray]] = {}
        for d, box in Placement(m, s).device_boxes(array.shape).items():
            per_host.setdefault(m.host_of(d), {})[d] = np.ascontiguousarray(view(array, full, box))
        array_id = uuid.uuid4().hex
        self._wait([(self.workers[h].put_shards.remote(array_id, shards), h) for h, shards in per_host.items()],
                   "storing shards")
        return DistributedArray(self, array_id, array.shape, dtype, m, s)

    def plan(self, array: DistributedArray, dst_mesh, dst_spec, strategy: str = "broadcast",
             loadbalance: str = "auto", chunks: int | None = None, seed: int = 0) -> ReshardingPlan:
        """The plan ``reshard`` would run (validates everything, moves nothing)."""
        return plan_resharding(array.shape, array.dtype, array.mesh, array.spec, self._mesh(dst_mesh),
                               ShardingSpec.parse(dst_spec), cluster=self.spec, strategy=strategy,
                               loadbalance=loadbalance, chunks=chunks, seed=seed)

    def reshard(self, array: DistributedArray, dst_mesh, dst_spec, strategy: str = "broadcast",
                loadbalance: str = "auto", chunks: int | None = None, seed: int = 0,
                plan: ReshardingPlan | None = None, in_order: bool = False) -> DistributedArray:
        """Move ``array`` to ``dst_mesh`` with layout ``dst_spec``; returns the new array.
        ``self.last`` then holds the measured time and the plan. ``in_order``: every host
        runs its transfers one after another in plan order instead of all at once (how
        Alpa 0.2.3's workers run its messages: the benchmark's Alpa baselines)."""
        self._check_usable()
        if array.cluster is not self:
            raise InvalidArgumentError(f"{array!r} belongs to another cluster")
        if not array.has_data:
            raise InvalidArgumentError(f"cannot reshard {array!r}: the 'signal' strategy produced it, it holds no data")
        plan = plan or self.plan(array, dst_mesh, dst_spec, strategy, loadbalance, chunks, seed)
        if tuple(plan.shape) != array.shape or plan.dtype != array.dtype:
            raise InvalidArgumentError(f"plan is for {plan.shape} {plan.dtype}, the array is {array.shape} {array.dtype}")
        dst_id = uuid.uuid4().hex
        refs = [(w.execute.remote(HostJob.for_host(plan, h), [array.id], [dst_id], self.timeout, True, in_order), h)
                for h, w in enumerate(self.workers)]
        # Hosts bound each wait themselves; the driver allows the plan's predicted time
        # three times over on top, so a long resharding is not cut short.
        results = self._wait(refs, f"resharding {array} to {plan.dst_spec} on {plan.dst_mesh.label()}",
                             timeout=2 * self.timeout + 10 + 3 * plan.predicted_seconds)
        start = min(r["start"] for r in results)
        end = max(r["end"] for r in results)
        self.last = ReshardStats(end - start, plan, {r["host"]: r for r in results})
        return DistributedArray(self, dst_id, array.shape, array.dtype, plan.dst_mesh, plan.dst_spec,
                                has_data=carries_data(plan.strategy))

    def plan_tree(self, arrays, placements, strategy: str = "broadcast", loadbalance: str = "auto",
                  bucket_bytes="auto", chunks: int | None = None, seed: int = 0):
        """The tree plan ``reshard_tree`` would run (validates everything, moves nothing)."""
        from ..resharding.tree import plan_resharding_tree, tree_flatten, tree_unflatten  # noqa: PLC0415

        src = tree_flatten(arrays)
        dst = tree_flatten(placements)
        if [p for p, _ in src] != [p for p, _ in dst]:
            raise InvalidArgumentError(f"arrays and placements differ in structure: {[p for p, _ in src][:4]} vs "
                                       f"{[p for p, _ in dst][:4]}")
        moves = []
        for (path, a), (_, pl) in zip(src, dst):
            if not isinstance(a, DistributedArray) or not isinstance(pl, Placement):
                raise InvalidArgumentError(f"{path}: expected a DistributedArray and a Placement, got "
                                           f"{type(a).__name__} and {type(pl).__name__}")
            moves.append(Resharding(a.shape, a.dtype, a.placement, Placement(self._mesh(pl.mesh), pl.spec)))
        # the moves in the arrays' own structure: plan leaf i is flattened array i, with its
        # path (a dict keyed by the paths would sort "/10" before "/2" and mismatch a list)
        layouts = tree_unflatten(arrays, moves)
        return plan_resharding_tree(layouts, cluster=self.spec, strategy=strategy, loadbalance=loadbalance,
                                    bucket_bytes=bucket_bytes, chunks=chunks, seed=seed)

    def reshard_tree(self, arrays, placements, strategy: str = "broadcast", loadbalance: str = "auto",
                     bucket_bytes="auto", chunks: int | None = None, seed: int = 0):
        """Reshard a pytree of ``DistributedArray``s to a pytree of ``Placement``s (same
        structure) with one jointly balanced, coalesced plan; returns the new tree."""
        from ..resharding.tree import tree_flatten, tree_unflatten  # noqa: PLC0415

        self._check_usable()
        plan = self.plan_tree(arrays, placements, strategy, loadbalance, bucket_bytes, chunks, seed)
        srcs = [a for _, a in tree_flatten(arrays)]
        dst_ids = [uuid.uuid4().hex for _ in srcs]
        refs = [(w.execute.remote(HostJob.for_host(plan, h), [a.id for a in srcs], dst_ids, self.timeout), h)
                for h, w in enumerate(self.workers)]
        results = self._wait(refs, f"resharding a tree of {len(srcs)} arrays",
                             timeout=2 * self.timeout + 10 + 3 * plan.predicted_seconds)
        start, end = min(r["start"] for r in results), max(r["end"] for r in results)
        self.last = ReshardStats(end - start, plan, {r["host"]: r for r in results})
        out = [DistributedArray(self, i, lf.shape, lf.dtype, lf.dst_mesh, lf.dst_spec,
                                has_data=carries_data(plan.strategy)) for i, lf in zip(dst_ids, plan.leaves)]
        return tree_unflatten(arrays, out)

    def _fetch(self, array: DistributedArray) -> dict[int, np.ndarray]:
        self._check_usable()
        hosts = sorted({array.mesh.host_of(d) for d in array.mesh.devices})
        parts = self._wait([(self.workers[h].get_shards.remote(array.id), h) for h in hosts], "fetching shards")
        out: dict[int, np.ndarray] = {}
        for p in parts:
            out.update(p)
        return out

    def checksums(self, array: DistributedArray) -> dict[int, str]:
        """blake2b per device buffer, computed on the hosts (for verifying big arrays)."""
        self._check_usable()
        hosts = sorted({array.mesh.host_of(d) for d in array.mesh.devices})
        out: dict[int, str] = {}
        for part in self._wait([(self.workers[h].checksums.remote(array.id), h) for h in hosts], "hashing shards"):
            out.update(part)
        return out

    def _delete(self, array: DistributedArray) -> None:
        if not self.closed and not self.broken:
            self._wait([(w.delete.remote(array.id), h) for h, w in enumerate(self.workers)], "deleting an array")

    # ------------------------------------------------------------- teardown
    def shutdown(self) -> None:
        """End the workers, Ray and (for ``emulated``) every namespace and process it created."""
        if self.closed:
            return
        self.closed = True
        try:
            import ray  # noqa: PLC0415

            if ray.is_initialized():
                for w in self.workers:
                    try:
                        ray.kill(w)
                    except Exception:  # noqa: BLE001 - already dead
                        pass
                ray.shutdown()
        finally:
            if self.network is not None:
                teardown_emulated(self.network)
            restore_env(self._saved_env)

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
