"""Shared test helpers."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests import strategies_hyp and exactness


def emulation_marks():
    """Marks for tests that need the emulated cluster: skipped, with the reason, where it
    cannot be built (no root or no iproute2), and marked slow."""
    from alpa_comm.runtime.emulated import netns

    try:
        netns.check_available()
        reason = None
    except netns.EmulationUnavailable as e:
        reason = str(e)
    return [pytest.mark.skipif(reason is not None, reason=reason or ""), pytest.mark.slow]


def require_machine_free():
    """Fail (naming it) when a live emulated cluster is up; a stale one, left by a run that was
    killed before tearing down, is removed by ``EmulatedNetwork.up`` itself."""
    from alpa_comm.runtime.emulated import netns

    if netns.cluster_exists() and netns.stale_reason() is None:
        pytest.fail(f"an emulated cluster is already up ({netns.describe_existing()}); "
                    "run 'alpa-comm cluster down'")


def alpa_harness_runner():
    """``run_in_subprocess`` of the Alpa harness, or a skip with the reason where Alpa
    0.2.3's wheel cannot be fetched."""
    from alpa_comm.integrations.alpa_harness.loader import run_in_subprocess
    from alpa_comm.integrations.alpa_harness.sources import SourcesUnavailable, alpa_root

    try:
        alpa_root()
    except SourcesUnavailable as e:
        pytest.skip(str(e))
    return run_in_subprocess


def alpa_package_runner():
    """``run(body) -> dict``: ``body`` run in a harness subprocess after Alpa 0.2.3's whole
    package is loaded (``alpa``, ``adapter`` and an ``out`` dict defined for it), ``out``
    returned as JSON; a skip with the reason where Alpa's wheel cannot be fetched."""
    import json

    run_in_subprocess = alpa_harness_runner()

    def run(body: str) -> dict:
        done = run_in_subprocess("import json\nalpa = load_package(ALPA_ROOT)\n"
                                 "from alpa_comm.integrations import alpa as adapter\n"
                                 "out = {}\n" + body + "\nprint(json.dumps(out))\n")
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    return run
