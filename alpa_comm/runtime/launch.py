"""How a ``Cluster`` starts: on this machine, on a running Ray cluster, or on the
emulated cluster (network namespaces + tc); one worker actor per host, joined
into one gloo group. Kept apart from ``cluster.py`` (what a started cluster
does: arrays, reshardings, waiting)."""
from __future__ import annotations

import dataclasses
import os
import sys
from .._extras import require
from ..errors import InvalidMeshError, InvalidOptionError
from ..topology import ClusterSpec
from .backend import DEFAULT_TIMEOUT_S, CommunicationError
from .emulated import netns, ray_nodes
from .emulated.launch import launch_emulated, restore_env, teardown_emulated
from .emulated.netns import host_ifname
from .emulated.ray_nodes import host_resource

EMULATED_LATENCY_S = 350e-6


def emulated_spec(num_hosts: int, devices_per_host: int, nic: str | None, **cluster_kw) -> ClusterSpec:
    """The spec the planner gets for an emulated cluster: its NIC rate (``nic``, tc syntax;
    None: unshaped, the spec's default) and the per-message latency measured on it;
    ``cluster_kw`` overrides either. Also for planning offline what such a cluster runs."""
    if nic is not None:
        cluster_kw.setdefault("nic_send_gbps", netns.rate_gbps(nic))
    # gloo over veth costs about 0.35 ms per message here (measured with
    # benchmarks/runtime_1_to_m.py); it sets the broadcast chunk count the planner picks.
    cluster_kw.setdefault("latency_s", EMULATED_LATENCY_S)
    return ClusterSpec(num_hosts=num_hosts, devices_per_host=devices_per_host, **cluster_kw)


class ClusterLaunchers:
    """The constructors of ``Cluster`` (a mixin: ``cls`` is the cluster class, so each
    returns a ``Cluster``; this module never imports ``cluster.py``, which imports it)."""

    @classmethod
    def open(cls, kind: str, num_hosts: int, devices_per_host: int, nic: str | None = "400mbit",
             timeout: float = DEFAULT_TIMEOUT_S, cpu: float | None = None, log=sys.stderr) -> "ClusterLaunchers":
        """The cluster a command line names: ``emulated`` (root + iproute2; ``nic`` and
        ``cpu`` shape each host), ``local``, or ``ray://HOST:PORT`` / ``HOST:PORT`` of a
        running Ray cluster, or ``auto`` (its node count sets the hosts)."""
        if kind == "emulated":
            return cls.emulated(num_hosts, devices_per_host, nic=None if nic in (None, "none") else nic,
                                timeout=timeout, log=log, cpu=cpu)
        if kind == "local":
            return cls.local(num_hosts, devices_per_host, timeout=timeout)
        address = kind[len("ray://"):] if kind.startswith("ray://") else kind
        if ":" not in address and address != "auto":
            raise InvalidOptionError(f"unknown cluster {kind!r}; use emulated, local, ray://HOST:PORT or auto "
                                     "(the Ray cluster this machine belongs to)")
        return cls.connect(address, devices_per_host, timeout=timeout)

    @classmethod
    def local(cls, num_hosts: int, devices_per_host: int, timeout: float = DEFAULT_TIMEOUT_S,
              **cluster_kw) -> "ClusterLaunchers":
        """A Ray cluster on the local machine, every host a worker process; no NIC shaping.
        Always a new one (``address="local"``): Ray's default would join the last cluster
        started on the same machine (``/tmp/ray/ray_current_cluster``), another job's."""
        ray = require("ray")  # the extra to install named when absent

        spec = ClusterSpec(num_hosts=num_hosts, devices_per_host=devices_per_host, **cluster_kw)
        ray.init(address="local", num_cpus=max(2, num_hosts),
                 resources={host_resource(h): 1 for h in range(num_hosts)},
                 include_dashboard=False, log_to_driver=False, configure_logging=False)
        try:
            return cls._start(spec, timeout, ifname="lo", network=None,
                              measure_intra="intra_host_gbps" not in cluster_kw)
        except BaseException:
            ray.shutdown()
            raise

    @classmethod
    def connect(cls, address: str, devices_per_host: int, timeout: float = DEFAULT_TIMEOUT_S,
                **cluster_kw) -> "ClusterLaunchers":
        """An existing Ray cluster: one host per node (nodes ordered by IP), pinned by node id."""
        ray = require("ray")  # the extra to install named when absent
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: PLC0415

        ray.init(address=address, log_to_driver=False)
        nodes = sorted((n for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) > 0),
                       key=lambda n: tuple(int(x) for x in n["NodeManagerAddress"].split(".")))
        if not nodes:
            ray.shutdown()
            raise InvalidMeshError(f"the Ray cluster at {address} has no live node with CPUs")
        spec = ClusterSpec(num_hosts=len(nodes), devices_per_host=devices_per_host, **cluster_kw)
        strategies = [NodeAffinitySchedulingStrategy(n["NodeID"], soft=False) for n in nodes]
        try:
            return cls._start(spec, timeout, ifname=None, network=None, strategies=strategies, owns_ray=False,
                              measure_intra="intra_host_gbps" not in cluster_kw)
        except BaseException:
            ray.shutdown()
            raise

    @classmethod
    def emulated(cls, num_hosts: int, devices_per_host: int, nic: str | None = "400mbit",
                 timeout: float = DEFAULT_TIMEOUT_S, log=sys.stderr, cpu: float | None = None,
                 **cluster_kw) -> "ClusterLaunchers":
        """Hosts as network namespaces with ``tc``-shaped NICs (see ``alpa_comm.runtime.emulated``);
        ``cpu`` caps each host at that many cores (hosts then compute side by side at a
        steady rate instead of contending for the machine's cores); ``shutdown``
        removes every namespace, cgroup and process it created."""
        network = launch_emulated(num_hosts, nic, log, cpu)
        try:
            return cls._attach(network, devices_per_host, timeout, log, owns_network=True, **cluster_kw)
        except BaseException:
            teardown_emulated(network)
            raise

    @classmethod
    def attach_emulated(cls, devices_per_host: int, timeout: float = DEFAULT_TIMEOUT_S, log=sys.stderr,
                        **cluster_kw) -> "ClusterLaunchers":
        """Drive the emulated cluster started by ``alpa-comm cluster up`` (left running at shutdown)."""
        network = netns.EmulatedNetwork.load()
        if network is None or "address" not in network.info:
            raise CommunicationError("no emulated cluster is up; run 'alpa-comm cluster up' first")
        return cls._attach(network, devices_per_host, timeout, log, owns_network=False, **cluster_kw)

    @classmethod
    def _attach(cls, network, devices_per_host: int, timeout: float, log, owns_network: bool,
                **cluster_kw) -> "ClusterLaunchers":
        ray = require("ray")  # the extra to install named when absent

        saved_env = {k: os.environ.get(k) for k in ray_nodes.auth_env("")}
        os.environ.update(ray_nodes.auth_env(network.info["token"]))
        ray_nodes.refresh_driver_auth()
        try:
            ray.init(address=network.info["address"], _node_ip_address=netns.LAUNCHER_IP, log_to_driver=False,
                     configure_logging=False)
            ray_nodes.wait_for_hosts(network.num_hosts)
            spec = emulated_spec(network.num_hosts, devices_per_host, network.rate, **cluster_kw)
            cluster = cls._start(spec, timeout, ifname=None, network=network if owns_network else None,
                                 emulated=True, measure_intra="intra_host_gbps" not in cluster_kw)
            cluster._saved_env = saved_env
            ray_nodes.say(log, f"alpa-comm: emulated cluster ready: {cluster.spec.describe()}")
            return cluster
        except BaseException:
            if ray.is_initialized():
                ray.shutdown()
            restore_env(saved_env)
            raise

    @classmethod
    def _start(cls, spec: ClusterSpec, timeout: float, ifname, network, strategies=None,
               owns_ray: bool = True, emulated: bool = False, measure_intra: bool = True) -> "ClusterLaunchers":
        """Start one worker per host and join them into the gloo group; ``measure_intra``
        (the user gave no ``intra_host_gbps``): plan with the slowest host's measured
        device-to-device copy rate (``HostWorker.copy_gbps``) instead of the spec's
        NVLink-class default, which on CPU hosts is hundreds of times too fast."""
        ray = require("ray")  # the extra to install named when absent

        actor = ray.remote(cls.worker_class)
        workers = []
        for h in range(spec.num_hosts):
            opts = {"num_cpus": 0, "max_concurrency": 1}
            if strategies:
                opts["scheduling_strategy"] = strategies[h]
            else:
                opts["resources"] = {host_resource(h): 1}
            name = ifname if ifname is not None else (host_ifname(h) if emulated else None)
            workers.append(actor.options(**opts).remote(h, spec.num_hosts, spec.devices_per_host, name))
        cluster = cls(spec, workers, timeout, network, owns_ray)
        try:
            cluster._wait([(w.ping.remote(), h) for h, w in enumerate(workers)], "starting its worker",
                          timeout=max(120.0, timeout))
            if measure_intra:
                rates = cluster._wait([(w.copy_gbps.remote(), h) for h, w in enumerate(workers)],
                                      "measuring its copy rate")
                cluster.spec = dataclasses.replace(spec, intra_host_gbps=round(min(rates), 1))
            addr, port = ray.get(workers[0].address.remote(), timeout=timeout)
            cluster._wait([(w.connect.remote(addr, port, timeout), h) for h, w in enumerate(workers)],
                          "joining the gloo group")
        except BaseException:
            cluster.shutdown()
            raise
        return cluster
