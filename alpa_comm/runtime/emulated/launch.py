"""Bring an emulated cluster up (namespaces, shaping, Ray nodes) and take it down."""
from __future__ import annotations

import os
import secrets
import sys

from . import netns, ray_nodes


def launch_emulated(num_hosts: int, nic: str | None, log=sys.stderr, cpu: float | None = None):
    """Namespaces, shaping (and, with ``cpu``, a CPU quota per host) and Ray nodes, with
    a fresh auth token; returns the network (its state file holds the Ray address and token)."""
    network = netns.EmulatedNetwork(num_hosts, nic, cpu=cpu).up()
    try:
        token = secrets.token_hex(32)
        network.remember(token=token)
        address = ray_nodes.start_ray(network, token, log=log)
        ray_nodes.track_descendants(network)
        network.remember(address=address)
        return network
    except BaseException:
        teardown_emulated(network)
        raise


def teardown_emulated(network) -> None:
    network.down()
    ray_nodes.cleanup_tmp()


def restore_env(saved: dict[str, str | None]) -> None:
    """Put back the Ray auth variables a driver changed to reach an emulated cluster."""
    if not saved:
        return
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    ray_nodes.refresh_driver_auth()
