"""Start a multi-process JAX program on this machine: one process per host, each a
``jax.distributed`` process with its own CPU devices; on the emulated cluster, process
``i`` runs as emulated host ``i`` (in its namespace, behind its shaped NIC).

One home for what the tests, the weight-sync example and ``alpa-comm bench --mode
processes`` all need: the coordinator address, the environment that makes gloo and the
group pick the host's interface, tracking every PID so a torn-down cluster ends them,
and a deadline after which a silent process is killed (never a hang).

The launched command reads its place from the environment (``worker_init`` does it):
``ALPA_COMM_JAX_RANK``, ``ALPA_COMM_JAX_WORLD``, ``ALPA_COMM_JAX_DEVICES``,
``ALPA_COMM_JAX_COORDINATOR``.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import CommunicationError, InvalidArgumentError

PACKAGE_ROOT = Path(__file__).resolve().parent.parent.parent


@dataclass
class ProcessOutput:
    rank: int
    returncode: int | None  # negative: ended by that signal (-9: killed at the deadline)
    stdout: str
    stderr: str

    def lines(self, prefix: str) -> list[str]:
        """The stdout lines that start with ``prefix``, without it."""
        return [ln[len(prefix):] for ln in self.stdout.splitlines() if ln.startswith(prefix)]


@contextlib.contextmanager
def config_file(cfg: dict):
    """``cfg`` as a JSON file every launched process can read (a process in a network
    namespace may not share the caller's umask), yielding its path; removed after."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cfg, f)
    path = Path(f.name)
    try:
        path.chmod(0o644)
        yield str(path)
    finally:
        path.unlink(missing_ok=True)


def reports_of(outs: list["ProcessOutput"], what: str = "") -> list[dict]:
    """Every process's ``RESULT`` line as JSON, by rank; where one is missing, an error
    with the stderr of the process that failed first (not one the launcher ended after
    it), ``what`` saying which run."""
    missing = [o for o in outs if not o.lines("RESULT ")]
    if missing:
        o = min(missing, key=lambda o: (o.returncode in (None, -9), o.rank))
        raise CommunicationError(f"{what}process {o.rank} ended without a result (exit code {o.returncode}):\n"
                                 f"{o.stderr[-3000:]}")
    return [json.loads(o.lines("RESULT ")[0]) for o in outs]


def launch(world: int, devices: int, command: list[str], *, network=None, timeout: float = 240,
           env: dict | None = None, fail_fast: bool = False, progress=None,
           cross_host_transfers: bool = False) -> list[ProcessOutput]:
    """Run ``command`` as ``world`` JAX processes of ``devices`` CPU devices each and wait
    for all (at most ``timeout`` seconds, then the rest are killed). ``network``: an
    ``EmulatedNetwork`` that is up (rank i = host i); else every rank on loopback.
    ``fail_fast``: once one process fails (non-zero exit), end the others after a few
    seconds instead of letting them wait for it until the deadline. ``progress``: called
    with each line a process writes to stderr as ``progress: ...``, as it comes.
    ``cross_host_transfers``: give every process its own address for JAX's cross-host
    ``device_put`` (``ALPA_COMM_JAX_TRANSFER_ADDRESS``; ``worker_init`` sets
    ``jax_cross_host_transfer_socket_address`` from it: a nonzero port of its own, as
    JAX needs)."""
    from ..runtime.emulated import netns  # noqa: PLC0415
    from ..runtime.worker import free_port  # noqa: PLC0415

    if network is not None and network.num_hosts < world:
        raise InvalidArgumentError(f"{world} processes need {world} emulated hosts, the network has {network.num_hosts}")
    coordinator = netns.host_ip(0) if network else "127.0.0.1"
    # inside host 0's namespace nothing else listens: a port derived from our PID is free
    port = 7000 + os.getpid() % 1000 if network else free_port(coordinator)
    base = {**os.environ, **(env or {}), "JAX_PLATFORMS": "cpu",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")])),
            "ALPA_COMM_JAX_WORLD": str(world), "ALPA_COMM_JAX_DEVICES": str(devices),
            "ALPA_COMM_JAX_COORDINATOR": f"{coordinator}:{port}"}
    procs, readers = [], []
    try:
        for r in range(world):
            penv = dict(base, ALPA_COMM_JAX_RANK=str(r), GLOO_SOCKET_IFNAME=netns.host_ifname(r) if network else "lo")
            if network:
                penv["ALPA_COMM_GROUP_ADDR"] = netns.host_ip(r)
            if cross_host_transfers:  # port 0 would be published as 0 and the receiver would hang
                ip = netns.host_ip(r) if network else "127.0.0.1"
                penv["ALPA_COMM_JAX_TRANSFER_ADDRESS"] = f"{ip}:{port + 1 + r if network else free_port(ip)}"
                if network:  # JAX's default streams bind 0.0.0.0 and publish an address the other
                    # namespaces cannot reach: bind its four streams to this host's own address
                    penv["ALPA_COMM_JAX_TRANSPORT_ADDRESSES"] = ",".join([f"{ip}:0"] * 4)
            prefix = network.exec_prefix(r) if network else []
            procs.append(subprocess.Popen(prefix + list(command), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True, env=penv))
            if network:
                network.track(procs[-1].pid)
            readers.append(_Reader(procs[-1], progress))
        deadline = time.monotonic() + timeout
        _wait(procs, deadline, fail_fast)
        for p in procs:
            if p.poll() is None:
                p.kill()
        outs = []
        for r, (p, reader) in enumerate(zip(procs, readers)):
            code = p.wait()
            reader.join()
            outs.append(ProcessOutput(r, code, reader.stdout(), reader.stderr()))
        return outs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


class _Reader:
    """Drains a process's stdout and stderr as it runs (a full pipe would block it), and
    passes its ``progress:`` lines on as they come."""

    PROGRESS = "progress: "

    def __init__(self, proc, progress):
        import threading  # noqa: PLC0415

        self.proc, self.progress = proc, progress
        self._out: list[str] = []
        self._err: list[str] = []
        self._threads = [threading.Thread(target=self._drain, args=(proc.stdout, self._out, False), daemon=True),
                         threading.Thread(target=self._drain, args=(proc.stderr, self._err, True), daemon=True)]
        for t in self._threads:
            t.start()

    def _drain(self, stream, into: list, is_err: bool) -> None:
        for line in stream:
            into.append(line)
            if is_err and self.progress and line.startswith(self.PROGRESS):
                self.progress(line[len(self.PROGRESS):].rstrip())

    def join(self) -> None:
        for t in self._threads:
            t.join(timeout=10)

    def stdout(self) -> str:
        return "".join(self._out)

    def stderr(self) -> str:
        return "".join(self._err)


def _wait(procs, deadline: float, fail_fast: bool, grace: float = 5.0) -> None:
    """Until all end or the deadline; with ``fail_fast``, once one fails (non-zero exit),
    give the others ``grace`` seconds (to report what they saw), then stop waiting."""
    failed_at = None
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        if fail_fast and failed_at is None and any(p.poll() not in (None, 0) for p in procs):
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() > failed_at + grace:
            return
        time.sleep(0.1)


def worker_init(x64: bool = False):
    """In a launched process: set up JAX from the launcher's environment and join the
    ``jax.distributed`` program; returns (rank, world, devices per process)."""
    import jax  # noqa: PLC0415

    rank, world = int(os.environ["ALPA_COMM_JAX_RANK"]), int(os.environ["ALPA_COMM_JAX_WORLD"])
    devices = int(os.environ["ALPA_COMM_JAX_DEVICES"])
    jax.config.update("jax_num_cpu_devices", devices)
    if os.environ.get("ALPA_COMM_JAX_TRANSFER_ADDRESS"):  # before the first jax.devices()
        jax.config.update("jax_cross_host_transfer_socket_address", os.environ["ALPA_COMM_JAX_TRANSFER_ADDRESS"])
    if os.environ.get("ALPA_COMM_JAX_TRANSPORT_ADDRESSES"):
        jax.config.update("jax_cross_host_transport_addresses", os.environ["ALPA_COMM_JAX_TRANSPORT_ADDRESSES"])
    if x64:
        jax.config.update("jax_enable_x64", True)
    jax.distributed.initialize(coordinator_address=os.environ["ALPA_COMM_JAX_COORDINATOR"], num_processes=world,
                               process_id=rank)
    return rank, world, devices


def python_command(module: str, *args: str) -> list[str]:
    """``python -m module args`` with this interpreter."""
    return [sys.executable, "-m", module, *args]


def run_worker(work, *args) -> int:
    """A launched process's main: ``work(*args)``'s exit code; on any failure the traceback
    on stderr, then an immediate exit (code 1) without JAX's shutdown barrier, where the
    other processes would wait for this one until their deadline."""
    try:
        return work(*args)
    except BaseException:  # noqa: BLE001 - say why, then leave
        import traceback  # noqa: PLC0415

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
