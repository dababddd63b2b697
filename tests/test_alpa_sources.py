"""The cache of Alpa's real sources: filled by one process at a time, whole or absent, and
a cache that cannot be written is a clear ``SourcesUnavailable`` (the Alpa tests skip
with it), not a crash."""
import shutil
import threading

import pytest

from alpa_comm.integrations.alpa_harness import sources


def test_workers_unpacking_a_cold_cache_at_once_all_get_the_whole_package(tmp_path, monkeypatch):
    try:
        wheel = sources.download(sources.ALPA, ".whl")  # the real wheel, from the warm cache or PyPI
    except sources.SourcesUnavailable as e:
        pytest.skip(str(e))
    (tmp_path / "downloads").mkdir()
    shutil.copy(wheel, tmp_path / "downloads" / wheel.name)
    monkeypatch.setenv("ALPA_COMM_CACHE", str(tmp_path))
    got, errors = [], []

    def unpack():
        try:
            got.append(sources.alpa_root())
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=unpack) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(got)) == 1, errors
    assert (got[0] / "alpa" / "pipeline_parallel" / "cross_mesh_resharding.py").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "alpa-0.2.3", "downloads"]


def test_a_cache_that_cannot_be_written_is_named(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("ALPA_COMM_CACHE", str(blocker / "cache"))
    with pytest.raises(sources.SourcesUnavailable, match="a-file"):
        sources.download(sources.ALPA, ".whl")
