"""Device meshes: n-d arrays of global device ids, host-major.

Global device id = host * devices_per_host + local index. A mesh of shape s on
k listed hosts uses the first prod(s)/k devices of each listed host, in host
order, reshaped to s: ``4x2@1,2,3,4`` on 4-device hosts is devices
4,5, 8,9, 12,13, 16,17. Meshes may also be built from explicit device ids.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import numpy as np

from .errors import InvalidMeshError
from .validation import positive_int

_HOSTS_ITEM = r"\d+(?:\s*-\s*\d+)?"
_MESH = re.compile(rf"^\s*(\d+(?:x\d+)*)\s*(?:@\s*({_HOSTS_ITEM}(?:\s*,\s*{_HOSTS_ITEM})*))?\s*$")


def host_list_text(hosts) -> str:
    """``0,1,2,3,8`` as ``0-3,8``: runs of three or more consecutive hosts as a range,
    so a 512-host mesh reads in one line; ``parse_mesh_text`` reads it back."""
    hosts = list(hosts)
    out, i = [], 0
    while i < len(hosts):
        j = i
        while j + 1 < len(hosts) and hosts[j + 1] == hosts[j] + 1:
            j += 1
        out += [f"{hosts[i]}-{hosts[j]}"] if j - i >= 2 else [str(h) for h in hosts[i:j + 1]]
        i = j + 1
    return ",".join(out)


def _expand_hosts(text: str, mesh_text: str) -> tuple[int, ...]:
    hosts: list[int] = []
    for item in text.split(","):
        a, _, b = item.partition("-")
        lo, hi = int(a), int(b) if b else int(a)
        if hi < lo:
            raise InvalidMeshError(f"mesh {mesh_text!r}: host range {item.strip()!r} runs backwards")
        hosts += range(lo, hi + 1)
    return tuple(hosts)


def parse_mesh_text(text: str) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """Split ``'2x4@0,1'`` into its shape and host list (None when no '@')."""
    m = _MESH.match(text) if isinstance(text, str) else None
    if not m:
        raise InvalidMeshError(f"cannot parse mesh {text!r}: expected SHAPE[@HOSTS] such as '2x4@0,1' "
                               "or '64x8@0-63'")
    shape = tuple(int(x) for x in m.group(1).split("x"))
    hosts = None if m.group(2) is None else _expand_hosts(m.group(2), text)
    if any(s <= 0 for s in shape):
        raise InvalidMeshError(f"mesh {text!r} has a non-positive dimension")
    return shape, hosts


def devices_per_host_needed(text: str) -> int:
    """Devices each host must have for the mesh written as ``text``."""
    shape, hosts = parse_mesh_text(text)
    k = len(hosts) if hosts else (shape[0] if len(shape) > 1 else 1)
    return -(-int(np.prod(shape)) // k)


def _ints(values, what: str) -> tuple[int, ...]:
    """``values`` as a tuple of ints (whole numbers of any integer type), or an error naming
    them: a string such as ``'2x4'`` is text for ``DeviceMesh.parse``, not a sequence."""
    try:
        out = None if isinstance(values, (str, bytes)) else tuple(int(v) for v in values)
    except (TypeError, ValueError, OverflowError):
        out = None
    if out is None or any(isinstance(v, bool) or o != v for o, v in zip(out, values)):
        raise InvalidMeshError(f"{what} must be a sequence of integers, got {values!r}")
    return out


def _id_array(device_ids) -> np.ndarray:
    """``device_ids`` as an int64 array, or an error naming them where they are not whole
    numbers (a float id would silently lose its fraction)."""
    try:
        raw = np.asarray(device_ids)
        with np.errstate(invalid="ignore"):
            ids = raw.astype(np.int64)
    except (TypeError, ValueError, OverflowError):
        ids = None
    if ids is None or (raw.dtype.kind not in "iu" and not np.array_equal(ids, raw)):
        raise InvalidMeshError(f"device ids must be an array of integers, got {device_ids!r}")
    return ids


@dataclass(frozen=True, eq=False)
class DeviceMesh:
    """An n-d array of global device ids on hosts of ``devices_per_host`` devices."""

    device_ids: np.ndarray
    devices_per_host: int

    def __post_init__(self):
        ids = _id_array(self.device_ids)
        if ids.ndim == 0 or ids.size == 0:
            raise InvalidMeshError(f"a mesh needs at least one device, got {self.device_ids!r}")
        if (ids < 0).any():
            raise InvalidMeshError(f"negative device id in mesh {ids.tolist()}")
        if len(np.unique(ids)) != ids.size:
            raise InvalidMeshError(f"mesh lists a device twice: {ids.tolist()}")
        positive_int(self.devices_per_host, "devices_per_host", InvalidMeshError)
        ids.setflags(write=False)
        object.__setattr__(self, "device_ids", ids)

    # ------------------------------------------------------------ constructors
    @classmethod
    def on_hosts(cls, shape: Sequence[int], hosts: Sequence[int], devices_per_host: int) -> "DeviceMesh":
        shape = _ints(shape, "mesh shape")
        hosts = _ints(hosts, "mesh hosts")
        positive_int(devices_per_host, "devices_per_host", InvalidMeshError)
        if not hosts:
            raise InvalidMeshError(f"a mesh needs at least one host, got {hosts!r}")
        total = int(np.prod(shape))
        label = "x".join(map(str, shape)) + "@" + host_list_text(hosts)
        if len(set(hosts)) != len(hosts):
            raise InvalidMeshError(f"mesh {label} lists a host twice")
        if any(h < 0 for h in hosts):
            raise InvalidMeshError(f"mesh {label} names a negative host")
        if total % len(hosts):
            raise InvalidMeshError(f"mesh {label}: {total} devices do not divide evenly over {len(hosts)} hosts")
        per = total // len(hosts)
        if per > devices_per_host:
            raise InvalidMeshError(
                f"mesh {label} needs {per} devices per host but hosts have {devices_per_host}")
        ids = [h * devices_per_host + i for h in hosts for i in range(per)]
        return cls(np.array(ids).reshape(shape), devices_per_host)

    @classmethod
    def parse(cls, text: "str | DeviceMesh", devices_per_host: int) -> "DeviceMesh":
        """``'2x4@2,3'``; without ``@`` the hosts are 0.. (one per row of a 2-d+ mesh)."""
        if isinstance(text, DeviceMesh):
            return text
        shape, hosts = parse_mesh_text(text)
        if hosts is None:
            hosts = tuple(range(shape[0] if len(shape) > 1 else 1))
        return cls.on_hosts(shape, hosts, devices_per_host)

    @classmethod
    def from_devices(cls, device_ids, devices_per_host: int) -> "DeviceMesh":
        return cls(np.asarray(device_ids), devices_per_host)

    # ------------------------------------------------------------------ views
    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.device_ids.shape)

    @property
    def ndim(self) -> int:
        return self.device_ids.ndim

    @property
    def size(self) -> int:
        return int(self.device_ids.size)

    @cached_property
    def devices(self) -> tuple[int, ...]:
        """Device ids in row-major mesh order."""
        return tuple(int(d) for d in self.device_ids.ravel())

    @cached_property
    def hosts(self) -> tuple[int, ...]:
        """Hosts the mesh touches, ascending."""
        return tuple(sorted({self.host_of(d) for d in self.devices}))

    def host_of(self, device: int) -> int:
        return int(device) // self.devices_per_host

    def coords(self):
        """(mesh coordinates, device id) for every device, row-major."""
        for coord in np.ndindex(*self.shape):
            yield coord, int(self.device_ids[coord])

    def overlaps(self, other: "DeviceMesh") -> set[int]:
        return set(self.devices) & set(other.devices)

    def label(self) -> str:
        """The shortest text form: ``2x4@0,1`` when it is a host block, else the ids."""
        shape = "x".join(map(str, self.shape))
        try:
            if DeviceMesh.on_hosts(self.shape, self.hosts, self.devices_per_host) == self:
                return f"{shape}@{host_list_text(self.hosts)}"
        except InvalidMeshError:
            pass
        return f"{shape}{list(self.devices)}"

    def __eq__(self, other) -> bool:
        return (isinstance(other, DeviceMesh) and self.devices_per_host == other.devices_per_host
                and self.shape == other.shape and bool((self.device_ids == other.device_ids).all()))

    def __hash__(self) -> int:
        return hash((self.shape, self.devices, self.devices_per_host))

    def __repr__(self) -> str:
        return f"DeviceMesh({self.label()})"

    def to_dict(self) -> dict:
        return {"shape": list(self.shape), "device_ids": list(self.devices), "devices_per_host": self.devices_per_host}

    @classmethod
    def from_dict(cls, d: dict) -> "DeviceMesh":
        return cls(np.array(d["device_ids"]).reshape(d["shape"]), d["devices_per_host"])
