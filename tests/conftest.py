"""Shared test helpers."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests import strategies_hyp and exactness


try:  # not installed where docs/alpa.md runs the Alpa tests in Alpa's own environment
    from hypothesis import settings
except ImportError:
    pass
else:  # its per-example deadline (200 ms) measures the machine, not the code: under
    # ``make test``'s two workers an example can wait for a core. No test here is about it.
    settings.register_profile("alpa_comm", deadline=None)
    settings.load_profile("alpa_comm")


def emulation_marks():
    """Marks for tests that need the emulated cluster: skipped, with the reason, where it
    cannot be built (no root or no iproute2), and marked slow. The cluster's names,
    addresses and ports are machine-wide, so under pytest-xdist (``make test`` runs
    ``--dist loadgroup``) these tests share one group, run one at a time on one worker."""
    from alpa_comm.runtime.emulated import netns

    try:
        netns.check_available()
        reason = None
    except netns.EmulationUnavailable as e:
        reason = str(e)
    return [pytest.mark.skipif(reason is not None, reason=reason or ""), pytest.mark.slow,
            pytest.mark.xdist_group("emulated-cluster")]


def local_ray_marks():
    """Marks for tests that start a local Ray cluster. Two could coexist, but each is a
    handful of processes with 30 s timeouts to meet on a 2-core CI machine: under
    pytest-xdist they run one at a time on one worker."""
    return [pytest.mark.xdist_group("local-ray")]


GROUPS_LOST = ("pytest-xdist's --dist loadgroup does not keep a group on one worker under pytest {}: the "
               "emulated-cluster tests would run at once and collide; install the dev extra's pytest (<9.2) "
               "or run without -n")


def pytest_configure(config):
    """Under ``--dist loadgroup`` pytest-xdist appends each test's group to its id, which is
    how it keeps a group on one worker. pytest 9.2 no longer takes the id the way xdist 3.8
    sets it (pytest-xdist issue #1386; hence ``pytest<9.2`` in the dev extra): refuse to
    start rather than let the groups silently run at once."""
    version = tuple(int(p) for p in pytest.__version__.split(".")[:2] if p.isdigit())
    if config.getoption("dist", None) == "loadgroup" and version >= (9, 2):
        raise pytest.UsageError(GROUPS_LOST.format(pytest.__version__))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """The same check on each worker, by what it does: a grouped test whose id lacks its
    group would run anywhere. (Raised in a worker, xdist reports it as an internal error.)"""
    if not getattr(config.option, "loadgroup", False):
        return

    def suffix(item) -> str:  # as xdist writes it: every group's name, sorted, joined by "_"
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        return "@" + "_".join(names) if names else ""

    lost = [item for item in items if suffix(item) and not item.nodeid.endswith(suffix(item))]
    if lost:
        raise pytest.UsageError(GROUPS_LOST.format(pytest.__version__) + f" (e.g. {lost[0].nodeid})")


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


def pytest_collect_file(file_path, parent):
    """README.md's and docs/*.md's ```python blocks lie outside ``testpaths``: collected
    (by Sybil) with tests/test_docs_blocks.py, which says how."""
    if file_path.name == "test_docs_blocks.py" and file_path.parent == Path(__file__).parent:
        from test_docs_blocks import pages_collector

        return pages_collector(parent, file_path)
    return None
