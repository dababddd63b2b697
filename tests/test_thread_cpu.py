"""``runtime.thread_cpu``: CPU seconds by thread name, and their difference."""
import sys
import time

import pytest

from alpa_comm.runtime.thread_cpu import difference, thread_cpu_seconds


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_busy_span_shows_up_on_this_threads_name():
    before = thread_cpu_seconds()
    assert before and all(v >= 0 for v in before.values())
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    spent = difference(thread_cpu_seconds(), before)
    assert sum(spent.values()) >= 0.2  # clock ticks are 10 ms: 0.3 s of spinning shows as most of it


def test_difference_keeps_only_names_that_spent_something():
    assert difference({"a": 1.5, "b": 2.0, "c": 0.5}, {"a": 1.0, "b": 2.0}) == {"a": 0.5, "c": 0.5}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_thread_that_names_itself_is_counted_apart():
    import threading

    from alpa_comm.runtime.thread_cpu import name_os_thread

    seen = {}

    def work():
        name_os_thread("acomm-test-spin-and-more")  # 15 bytes kept: "acomm-test-spin"
        end = time.thread_time() + 0.2  # this thread's own CPU clock
        while time.thread_time() < end:
            pass
        seen.update(thread_cpu_seconds())

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert seen.get("acomm-test-spin", 0.0) >= 0.05
