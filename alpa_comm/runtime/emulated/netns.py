"""An emulated multi-host network on one machine: network namespaces + tc.

Each host is a network namespace ``acomm-h<i>`` joined to the bridge
``acomm-br0`` by a veth pair (``acomm-v<i>`` in the root namespace,
``acomm-e<i>`` inside). ``tc tbf`` on both ends caps that host's send and
receive rate; loopback inside a namespace stays unshaped, like NVLink next to
a NIC. The root namespace sits on the bridge too (198.18.0.1) as the launcher
machine. Addresses come from 198.18.0.0/24 (reserved for benchmarking).

Everything created is recorded in a state file *before* it is created, so
``down()`` (also ``alpa-comm cluster down``) removes it after a crash too:
processes inside the namespaces (by PID, from ``ip netns pids``), processes we
started (by PID), the root-side veths (which removes both ends at once), the
bridge and the namespaces. A second ``up()`` while a live one exists fails with
a clear message naming its owner; a *stale* one (its owning process is gone and
no process runs inside its namespaces: a run that was SIGKILLed before it could
tear down) is removed first, saying so, instead of blocking every later run.
"""
from __future__ import annotations

import json
import logging
import math
import numbers
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import AlpaCommError, InvalidOptionError
from ...validation import is_int

logger = logging.getLogger(__name__)

PREFIX = "acomm"
BRIDGE = f"{PREFIX}-br0"
SUBNET = "198.18.0"
LAUNCHER_IP = f"{SUBNET}.1"
TBF_LATENCY = os.environ.get("ALPA_COMM_TBF_LATENCY", "50ms")  # queue bound: deep queues add hop delay
TBF_BURST_ENV = "ALPA_COMM_TBF_BURST"
"""An experiment's knob: the bytes a shaped NIC may pass at once (a size as tc reads it,
e.g. ``1mb``). Unset: 1/250 s of traffic, at least 64 KiB. A bucket of B bytes lets a
transfer that follows an idle gap send up to B bytes faster than the rate, so a large one
flatters the link; it also changes how tbf paces and splits what it passes (a packet
larger than the bucket is cut into frames), and with it how the hosts' CPU is spent on
arrivals, which docs/train.md measures."""
STATE_FILE = Path(os.environ.get("ALPA_COMM_STATE", "/tmp/alpa_comm_cluster.json"))
CPU_CGROUP_ROOT = Path(os.environ.get("ALPA_COMM_CPU_CGROUP", "/sys/fs/cgroup/cpu"))  # cgroup v1 cpu controller
CPU_PERIOD_US = 5_000  # short periods: a throttled host waits at most a few ms, not tens
MIN_QUOTA_US = 1_000  # the kernel refuses a smaller cpu.cfs_quota_us


class EmulationUnavailable(AlpaCommError, RuntimeError):
    """Root or iproute2 is missing: the emulated cluster cannot be built here."""


class ClusterExistsError(AlpaCommError, RuntimeError):
    """An emulated cluster is already up."""


def namespace(host: int) -> str:
    return f"{PREFIX}-h{host}"


def host_ip(host: int) -> str:
    return f"{SUBNET}.{10 + host}"


def host_ifname(host: int) -> str:
    return f"{PREFIX}-e{host}"


def _root_veth(host: int) -> str:
    return f"{PREFIX}-v{host}"


def check_available() -> None:
    """Raise ``EmulationUnavailable`` with the reason when this machine cannot emulate."""
    if os.geteuid() != 0:
        raise EmulationUnavailable("the emulated cluster needs root (network namespaces and tc)")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise EmulationUnavailable(f"the emulated cluster needs '{tool}' (Debian package iproute2)")


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(list(args), capture_output=True, text=True)
    if check and out.returncode != 0:
        raise AlpaCommError(f"command failed: {' '.join(args)}: {out.stderr.strip()}")
    return out


def emulation_knobs() -> dict[str, str]:
    """The environment variables set now that change how the emulated network behaves
    (a benchmark records them beside its results: the same command without them measures
    another network)."""
    return {k: os.environ[k] for k in ("ALPA_COMM_TBF_LATENCY", TBF_BURST_ENV) if os.environ.get(k)}


def command_line(script: str, argv: list[str]) -> str:
    """How to run ``script`` again as it ran now: root, the emulation's knobs that were set,
    the arguments given."""
    knobs = [f"{k}={shlex.quote(v)}" for k, v in emulation_knobs().items()]
    return " ".join(["sudo", *knobs, ".venv/bin/python", script, *map(shlex.quote, argv)])


def existing_namespaces() -> list[str]:
    out = _run("ip", "netns", "list", check=False).stdout
    return sorted(line.split()[0] for line in out.splitlines() if line.startswith(f"{PREFIX}-h"))


def _burst(rate: str) -> str:
    """tbf needs a bucket of at least rate/HZ; 1/250 s of traffic, at least 64 KiB (or
    ``$ALPA_COMM_TBF_BURST``)."""
    bits = _rate_bits(rate)
    override = os.environ.get(TBF_BURST_ENV, "")
    return f"{_bucket_bytes(override)}b" if override else f"{max(64 * 1024, int(bits / 8 / 250))}b"


MIN_BUCKET_BYTES = 2048
"""A bucket must hold a whole frame (1514 bytes on these veths): tbf drops a packet larger
than its bucket that it cannot split, and a transfer would stall instead of failing."""
_SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "m": 1024 ** 2, "mb": 1024 ** 2, "g": 1024 ** 3, "gb": 1024 ** 3}


def _bucket_bytes(size: str) -> int:
    """``$ALPA_COMM_TBF_BURST`` in bytes, read as tc reads a size (a number, decimals allowed,
    then b, k[b], m[b] or g[b], any case; 1k = 1024), between ``MIN_BUCKET_BYTES`` and the
    4 GiB tc takes."""
    got = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", size.lower())
    if not got or got.group(2) not in _SIZE_UNITS:
        raise InvalidOptionError(f"{TBF_BURST_ENV}={size!r}: expected a size in bytes: N, Nb, Nk[b], Nm[b] or Ng[b]")
    n = int(float(got.group(1)) * _SIZE_UNITS[got.group(2)])
    if not MIN_BUCKET_BYTES <= n < 4 * 1024 ** 3:
        raise InvalidOptionError(f"{TBF_BURST_ENV}={size!r} is {n} bytes: a bucket takes {MIN_BUCKET_BYTES} bytes "
                                 f"(a whole frame) to under 4 GiB")
    return n


def _rate_bits(rate: str) -> float:
    """A tc rate ('400mbit', '1gbit', '64000bit') in bit/s, or an error naming it."""
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bit": 1.0}
    got = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?bit)", rate) if isinstance(rate, str) else None
    if not got or float(got.group(1)) <= 0:
        raise InvalidOptionError(f"cannot read NIC rate {rate!r}: expected e.g. 400mbit or 1gbit")
    return float(got.group(1)) * units[got.group(2)]


def rate_gbps(rate: str) -> float:
    """'400mbit' -> 0.4."""
    units = {"kbit": 1e-6, "mbit": 1e-3, "gbit": 1.0, "bit": 1e-9}
    _rate_bits(rate)  # named if it is no rate
    unit = next(u for u in units if rate.endswith(u))
    return float(rate[: -len(unit)]) * units[unit]


@dataclass
class EmulatedNetwork:
    num_hosts: int
    rate: str | None = "400mbit"  # None: unshaped
    state_file: Path = STATE_FILE
    pids: list[int] = field(default_factory=list)
    info: dict = field(default_factory=dict)  # e.g. the Ray address and token of `alpa-comm cluster up`
    cpu: float | None = None  # CPU cores per host (a cgroup quota); None: uncapped
    owner: list | None = None  # [pid, start time] of the process that brought it up

    # ------------------------------------------------------------------ up
    def up(self) -> "EmulatedNetwork":
        check_available()
        if not is_int(self.num_hosts) or not 1 <= self.num_hosts <= 200:
            raise InvalidOptionError(f"num_hosts must be 1..200, got {self.num_hosts!r}")
        if self.rate is not None:
            _burst(self.rate)  # validate before touching anything
        if self.cpu is not None:
            check_cpu_cap(self.cpu)
        if cluster_exists(self.state_file):
            reason = stale_reason(self.state_file)
            if reason is None:
                raise ClusterExistsError(
                    f"an emulated cluster is already up ({describe_existing(self.state_file)}); "
                    "run 'alpa-comm cluster down' first")
            logger.warning("alpa-comm: removing a stale emulated cluster (%s)", reason)
            remove_existing(self.state_file)
        self.owner = _process_identity(os.getpid())
        self._save()
        try:
            _run("ip", "link", "add", BRIDGE, "type", "bridge")
            _run("ip", "addr", "add", f"{LAUNCHER_IP}/24", "dev", BRIDGE)
            _run("ip", "link", "set", BRIDGE, "up")
            for h in range(self.num_hosts):
                ns, outer, inner = namespace(h), _root_veth(h), host_ifname(h)
                _run("ip", "netns", "add", ns)
                _run("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
                _run("ip", "link", "set", inner, "netns", ns)
                _run("ip", "link", "set", outer, "master", BRIDGE)
                _run("ip", "link", "set", outer, "up")
                _run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
                _run("ip", "netns", "exec", ns, "ip", "addr", "add", f"{host_ip(h)}/24", "dev", inner)
                _run("ip", "netns", "exec", ns, "ip", "link", "set", inner, "up")
                if self.rate is not None:
                    burst = _burst(self.rate)
                    tbf = ["tbf", "rate", self.rate, "burst", burst, "latency", TBF_LATENCY]
                    _run("tc", "qdisc", "add", "dev", outer, "root", *tbf)  # into the host: its receive side
                    _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", inner, "root", *tbf)  # its send side
                if self.cpu is not None:
                    group = cpu_cgroup(h)
                    group.mkdir(exist_ok=True)
                    (group / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
                    (group / "cpu.cfs_quota_us").write_text(str(int(self.cpu * CPU_PERIOD_US)))
        except BaseException:
            self.down()
            raise
        return self

    # ---------------------------------------------------------------- state
    def _save(self) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.touch(mode=0o600)  # it may hold a Ray auth token
        tmp.write_text(json.dumps({"num_hosts": self.num_hosts, "rate": self.rate, "pids": self.pids,
                                   "info": self.info, "cpu": self.cpu,
                                   "owner": self.owner}))
        tmp.replace(self.state_file)

    def remember(self, **info) -> None:
        self.info.update(info)
        self._save()

    def track(self, pid: int) -> None:
        """Record a process we started so ``down`` ends it (by PID) even after a crash."""
        self.pids.append(pid)
        self._save()

    @classmethod
    def load(cls, state_file: Path = STATE_FILE) -> "EmulatedNetwork | None":
        if not state_file.exists():
            return None
        d = json.loads(state_file.read_text())
        return cls(d["num_hosts"], d["rate"], state_file, d.get("pids", []), d.get("info", {}), d.get("cpu"),
                   d.get("owner"))

    def exec_prefix(self, host: int) -> list[str]:
        """Run a command as host ``host``: in its namespace and, with a CPU cap, in its
        cgroup (joined before the command starts, so every process it forks is capped;
        joined outside the namespace, whose own /sys does not show the cgroup mounts)."""
        prefix = ["ip", "netns", "exec", namespace(host)]
        if self.cpu is None:
            return prefix
        procs = cpu_cgroup(host) / "cgroup.procs"
        return ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh"] + prefix

    # ----------------------------------------------------------------- down
    def qdisc_stats(self) -> list[dict]:
        """Per host, what its two shaped NIC sides did so far: ``{"send": {...}, "receive":
        {...}}`` with ``sent_bytes``, ``dropped`` and ``overlimits`` each (``tc -s``); the
        drops show where a run overflowed a NIC queue (TCP then retransmits)."""
        import re  # noqa: PLC0415

        def parse(text: str) -> dict:
            m = re.search(r"Sent (\d+) bytes \d+ pkt \(dropped (\d+), overlimits (\d+)", text)
            return {"sent_bytes": int(m.group(1)), "dropped": int(m.group(2)), "overlimits": int(m.group(3))} \
                if m else {}
        out = []
        for h in range(self.num_hosts):
            receive = _run("tc", "-s", "qdisc", "show", "dev", _root_veth(h), check=False).stdout
            send = _run("ip", "netns", "exec", namespace(h), "tc", "-s", "qdisc", "show", "dev", host_ifname(h),
                        check=False).stdout
            out.append({"send": parse(send), "receive": parse(receive)})
        return out

    def down(self) -> None:
        """Remove everything this network created; safe to call twice or after a crash."""
        for ns in [namespace(h) for h in range(self.num_hosts)] + existing_namespaces():
            kill_namespace_processes(ns)
        kill_pids(self.pids)
        for h in range(max(self.num_hosts, len(existing_namespaces()))):
            if Path(f"/sys/class/net/{_root_veth(h)}").exists():
                _run("ip", "link", "del", _root_veth(h), check=False)
        if Path(f"/sys/class/net/{BRIDGE}").exists():
            _run("ip", "link", "del", BRIDGE, check=False)
        for ns in existing_namespaces():
            _run("ip", "netns", "del", ns, check=False)
        remove_cpu_cgroups(self.num_hosts)
        self.state_file.unlink(missing_ok=True)
        self.state_file.with_suffix(".tmp").unlink(missing_ok=True)

    def status(self) -> dict:
        return {"hosts": self.num_hosts, "rate": self.rate, "cpu_per_host": self.cpu,
                "ray_address": self.info.get("address"),
                "namespaces": existing_namespaces(),
                "processes": {ns: namespace_pids(ns) for ns in existing_namespaces()},
                "tracked_pids": [p for p in self.pids if _alive(p)]}


def cluster_exists(state_file: Path = STATE_FILE) -> bool:
    """Anything of an emulated cluster on this machine: state file, namespaces or bridge."""
    return state_file.exists() or bool(existing_namespaces()) or Path(f"/sys/class/net/{BRIDGE}").exists()


def _load_quietly(state_file: Path) -> "EmulatedNetwork | None":
    try:
        return EmulatedNetwork.load(state_file)
    except (OSError, ValueError, KeyError, TypeError):
        return None  # a half-written or foreign file: judged by what runs, below


def _process_identity(pid: int) -> list | None:
    """[pid, start time in clock ticks]: a PID alone may be reused by an unrelated process."""
    try:
        return [pid, int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])]
    except (OSError, IndexError, ValueError):
        return None


def _owner_alive(owner) -> bool:
    if not owner:
        return False
    pid = int(owner[0])
    return _alive(pid) and _process_identity(pid) == [pid, int(owner[1])]


def stale_reason(state_file: Path = STATE_FILE) -> str | None:
    """Why the cluster on this machine is stale and safe to remove, or None when it may be in use.

    Stale means nobody can still be using it: the process that brought it up has
    ended (or no state says who did), no process we started is alive and no
    process runs inside any of its namespaces. A cluster from ``alpa-comm cluster
    up`` always has Ray inside, so it is never judged stale while it works.
    """
    net = _load_quietly(state_file)
    if net is not None and _owner_alive(net.owner):
        return None
    if net is not None and any(_alive(p) for p in net.pids):
        return None
    if any(namespace_pids(ns) for ns in existing_namespaces()):
        return None
    if net is None:
        return "no state file names an owner and no process runs inside its namespaces"
    if net.owner:
        return f"its owner, PID {net.owner[0]}, has ended and no process runs inside it"
    return "no process runs inside it and none it started is alive"


def describe_existing(state_file: Path = STATE_FILE) -> str:
    net = _load_quietly(state_file)
    what = ", ".join(existing_namespaces()) or BRIDGE
    if net is not None and _owner_alive(net.owner):
        what += f"; brought up by PID {net.owner[0]}, still running"
    return what


def existing_network(state_file: Path = STATE_FILE) -> "EmulatedNetwork":
    """The cluster on this machine as its state file records it, or, without one, as far as
    its namespaces show it (enough for ``down``)."""
    return _load_quietly(state_file) or EmulatedNetwork(len(existing_namespaces()), None, state_file)


def remove_existing(state_file: Path = STATE_FILE) -> None:
    """Tear down whatever cluster is on this machine."""
    existing_network(state_file).down()


def cpu_cgroup(host: int) -> Path:
    return CPU_CGROUP_ROOT / f"{PREFIX}-h{host}"


def check_cpu_cores(cores: float) -> None:
    """A per-host CPU share the cgroup can hold: finite and at least the kernel's least quota
    per period (``AlpaCommError`` naming the value, before anything is set up)."""
    if not (isinstance(cores, numbers.Real) and not isinstance(cores, bool) and math.isfinite(cores)
            and cores * CPU_PERIOD_US >= MIN_QUOTA_US):
        raise InvalidOptionError(f"CPU cores per host must be a number >= {MIN_QUOTA_US / CPU_PERIOD_US:g} (the "
                                 f"kernel's least quota, {MIN_QUOTA_US} us, in a {CPU_PERIOD_US} us period), got {cores!r}")


def check_cpu_cap(cores: float) -> None:
    """A per-host CPU cap needs a share the cgroup can hold and the cgroup v1 cpu
    controller, writable (root)."""
    check_cpu_cores(cores)
    if not (CPU_CGROUP_ROOT / "cpu.cfs_quota_us").exists() or not os.access(CPU_CGROUP_ROOT, os.W_OK):
        raise EmulationUnavailable(f"capping a host's CPU needs a writable cgroup v1 cpu controller at "
                                   f"{CPU_CGROUP_ROOT} (set ALPA_COMM_CPU_CGROUP to another mount)")


def remove_cpu_cgroups(num_hosts: int, wait_s: float = 5.0) -> None:
    """Remove our hosts' cgroups (a cgroup can go once its processes have exited)."""
    groups = [cpu_cgroup(h) for h in range(num_hosts)]
    groups += [g for g in CPU_CGROUP_ROOT.glob(f"{PREFIX}-h*") if g not in groups] if CPU_CGROUP_ROOT.exists() else []
    deadline = time.monotonic() + wait_s
    for g in groups:
        while g.exists():
            try:
                g.rmdir()
            except OSError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.1)


def namespace_pids(ns: str) -> list[int]:
    out = _run("ip", "netns", "pids", ns, check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def _alive(pid: int) -> bool:
    """Running (a zombie has ended; it only waits for its parent to collect it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def kill_pids(pids, grace: float = 3.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds, each PID given (never by name)."""
    pids = [p for p in pids if p != os.getpid() and _alive(p)]
    for p in pids:
        try:
            os.kill(p, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        _reap(pids)
        time.sleep(0.1)
    for p in pids:
        if _alive(p):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
    _reap(pids)


def _reap(pids) -> None:
    """Collect our own exited children so they do not linger as zombies (which look alive)."""
    for p in pids:
        try:
            os.waitpid(p, os.WNOHANG)
        except ChildProcessError:
            pass


def kill_namespace_processes(ns: str) -> None:
    for _ in range(3):  # processes may spawn others while we kill
        pids = namespace_pids(ns)
        if not pids:
            return
        kill_pids(pids)
