"""The Alpa baseline from Alpa's own code: the messages Alpa 0.2.3 compiles for a case.

``AlpaBaseline(cases, devices_per_host)`` runs Alpa's real ``CrossMeshCommunicator``
(strategy generation, ``normal`` load balance, local all-gather rewrite) and its
``SymbolicReshardingTask`` compiler on every case, in one harness process
(``alpa_harness``), and answers ``compiled_sends(case, method)`` for
``suites.plan_method``: per case and Alpa baseline, the (sender device, receiver
device, box) messages in Alpa's order, re-sends included. Where the harness cannot
run (no package registry, no cache), ``available`` is False with the reason, and the
suites fall back to alpa_comm's model of Alpa (``suites.FROM_MODEL``).
"""
from __future__ import annotations

import json
from typing import Sequence

from ..mesh import DeviceMesh
from ..suites import ALPA_BASELINES, Case, Method

MODE = {"alpa": "alpa", "alpa_send_recv": "alpa_send_recv"}
"""Suite baseline -> conformance mode (with and without Alpa's local all-gather)."""

SCRIPT = r'''
import json, sys
load_package(ALPA_ROOT)
from alpa_comm.integrations.alpa_harness.conformance import compiled_sends
jobs = json.loads(sys.stdin.read())
print(json.dumps([compiled_sends(case, mode)[0]["sends"] for case, mode in jobs]))
'''


def _key(case: Case) -> tuple:
    return (tuple(case.shape), case.dtype, str(case.src_mesh), str(case.src_spec), str(case.dst_mesh),
            str(case.dst_spec))


class AlpaBaseline:
    """Alpa 0.2.3's compiled sends for ``cases`` (computed once, in one subprocess)."""

    def __init__(self, cases: Sequence[Case], devices_per_host: int, timeout: float = 600):
        from .alpa_harness.conformance import side, tensor
        from .alpa_harness.loader import run_in_subprocess
        from .alpa_harness.sources import SourcesUnavailable

        self.devices_per_host = devices_per_host
        self.sends: dict[tuple, list] = {}
        self.reason = ""
        jobs, keys = [], []
        for c in cases:
            src, dst = DeviceMesh.parse(str(c.src_mesh), devices_per_host), DeviceMesh.parse(str(c.dst_mesh),
                                                                                            devices_per_host)
            case = {"name": c.name, "src": side(src), "dst": side(dst),
                    "tensors": [tensor(c.shape, src, str(c.src_spec), dst, str(c.dst_spec))]}
            for method in ALPA_BASELINES:
                jobs.append([case, MODE[method]])
                keys.append((_key(c), method))
        if not jobs:
            return
        try:
            done = run_in_subprocess(SCRIPT, stdin=json.dumps(jobs), timeout=timeout)
        except SourcesUnavailable as e:
            self.reason = str(e)
            return
        if done.returncode != 0:
            self.reason = "Alpa's code failed in the harness: " + done.stderr.strip().splitlines()[-1]
            return
        for key, sends in zip(keys, json.loads(done.stdout)):
            self.sends[key] = [(self._device(s), self._device(r), tuple(tuple(b) for b in box))
                               for s, r, box in sends]

    @property
    def available(self) -> bool:
        return bool(self.sends)

    def _device(self, device_str: str) -> int:
        ip, _, local = device_str.rsplit(":", 2)
        return int(ip.rsplit(".", 1)[1]) * self.devices_per_host + int(local)

    def __call__(self, case: Case, method: Method):
        """``suites.plan_method``'s ``compiled_sends``: Alpa's messages, or None."""
        return self.sends.get((_key(case), method.name))
