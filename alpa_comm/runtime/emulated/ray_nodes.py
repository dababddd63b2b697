"""Ray nodes on the emulated network: a head in the root namespace (the launcher,
where the driver runs, 0 CPUs so no work lands there) and one node per host
namespace, tagged with the custom resource ``acomm_host_<i>``.

Every ``ray start --block`` process is started by us, in its own session, and
recorded (with its descendants) in the network's state file, so teardown ends
exactly these processes by PID.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from ...errors import AlpaCommError
from .netns import LAUNCHER_IP, EmulatedNetwork, host_ip

logger = logging.getLogger(__name__)

GCS_PORT = 6390
RAY_TMP = "/tmp/acomm_ray"


def host_resource(host: int) -> str:
    return f"acomm_host_{host}"


def _ray_cli() -> str:
    cand = Path(sys.executable).with_name("ray")
    if cand.exists():
        return str(cand)
    found = shutil.which("ray")
    if not found:
        raise AlpaCommError("the 'ray' command is missing: pip install 'alpa_comm[runtime]'")
    return found


def _descendants(pid: int) -> list[int]:
    try:
        import psutil  # noqa: PLC0415 - installed with ray

        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except Exception:  # noqa: BLE001 - the process may be gone already
        return []


def auth_env(token: str) -> dict[str, str]:
    """Ray's token authentication with a token made for this cluster (Ray >= 2.52); the
    driver needs the same variables to connect."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}


def refresh_driver_auth() -> None:
    """Make this (driver) process re-read RAY_AUTH_MODE / RAY_AUTH_TOKEN from its
    environment: Ray caches both once it is imported. Older Rays have no token auth."""
    try:
        from ray._raylet import AuthenticationTokenLoader, Config  # noqa: PLC0415
    except ImportError:
        return
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def start_ray(network: EmulatedNetwork, token: str, object_store_mb: int = 256, timeout: float = 180.0,
              log=sys.stderr) -> str:
    """Start the head and one node per host; returns the GCS address (nodes join in the background)."""
    ray = _ray_cli()
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_DISABLE_DOCKER_CPU_WARNING="1", **auth_env(token))
    common = ["--block", "--disable-usage-stats", f"--object-store-memory={object_store_mb << 20}",
              f"--temp-dir={RAY_TMP}"]
    logdir = Path(RAY_TMP + "_logs")
    logdir.mkdir(parents=True, exist_ok=True)
    procs = []

    def launch(cmd: list[str], name: str) -> None:
        out = open(logdir / f"{name}.log", "wb")  # noqa: SIM115 - lives as long as the process
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                             start_new_session=True)
        network.track(p.pid)
        procs.append((name, p))

    address = f"{LAUNCHER_IP}:{GCS_PORT}"
    launch([ray, "start", "--head", f"--node-ip-address={LAUNCHER_IP}", f"--port={GCS_PORT}", "--num-cpus=0",
            "--include-dashboard=false", *common], "head")
    _wait_port(LAUNCHER_IP, GCS_PORT, timeout, procs)
    for h in range(network.num_hosts):
        # One node at a time: nodes sharing a machine pick their socket file names in the
        # shared session directory, and simultaneous starts collide.
        launch(network.exec_prefix(h) + [ray, "start", f"--address={address}", f"--node-ip-address={host_ip(h)}",
                                         "--num-cpus=1", f"--resources={json.dumps({host_resource(h): 1})}",
                                         *common], f"host{h}")
        _wait_log(logdir / f"host{h}.log", "Ray runtime started", timeout, procs, f"host{h}")
        say(log, f"alpa-comm: Ray node for host {h} is up")
    return address


def say(log, message: str) -> None:
    """A progress line on the stream the caller chose (the CLI's stderr), else to this
    module's logger at INFO (silent unless the program configures logging)."""
    if log:
        print(message, file=log, flush=True)
    else:
        logger.info(message)


def _wait_log(path: Path, marker: str, timeout: float, procs, name: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for n, p in procs:
            if p.poll() is not None:
                raise AlpaCommError(f"Ray {n} exited with code {p.returncode}; see {path.parent}/{n}.log")
        if path.exists() and marker in path.read_text(errors="replace"):
            return
        time.sleep(0.3)
    raise AlpaCommError(f"Ray {name} did not start within {timeout:g} s; see {path}")


def _wait_port(ip: str, port: int, timeout: float, procs) -> None:
    import socket  # noqa: PLC0415

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name, p in procs:
            if p.poll() is not None:
                raise AlpaCommError(f"Ray {name} exited with code {p.returncode}; see {RAY_TMP}_logs/{name}.log")
        try:
            with socket.create_connection((ip, port), timeout=1):
                return
        except OSError:
            time.sleep(0.5)
    raise AlpaCommError(f"Ray head did not listen on {ip}:{port} within {timeout:g} s; see {RAY_TMP}_logs/head.log")


def track_descendants(network: EmulatedNetwork) -> None:
    """Record the processes our ``ray start`` processes spawned in the root namespace."""
    for pid in list(network.pids):
        for child in _descendants(pid):
            if child not in network.pids:
                network.track(child)


def wait_for_hosts(num_hosts: int, timeout: float = 180.0) -> None:
    """Block until the connected Ray cluster offers every host resource."""
    import ray  # noqa: PLC0415

    deadline = time.monotonic() + timeout
    need = {host_resource(h) for h in range(num_hosts)}
    while time.monotonic() < deadline:
        have = set(ray.cluster_resources())
        if need <= have:
            return
        time.sleep(0.5)
    missing = sorted(need - set(ray.cluster_resources()))
    raise AlpaCommError(f"Ray nodes for {missing} did not join within {timeout:g} s; see {RAY_TMP}_logs/")


def cleanup_tmp() -> None:
    shutil.rmtree(RAY_TMP, ignore_errors=True)
