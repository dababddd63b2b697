"""Merging what each program of a group describes (``alpa_comm.jax.programs``): pure JSON,
no JAX needed; every disagreement is refused with the ranks named."""
import json

import pytest

from alpa_comm.errors import InvalidOptionError
from alpa_comm.jax.programs import merge, placement_of

SRC = [["/w", {"shape": [8, 4], "dtype": "float32", "wire": "float32", "ids": [[0, 1], [2, 3]],
               "axes": ["data", "fsdp"], "pspec": [["data", "fsdp"]]}]]
DST = {"/w": {"ids": [4, 5], "axes": ["tp"], "pspec": [None, "tp"]}}


def member(first, src=None, dst=None, dph=2):
    return json.dumps({"first": first, "devices_per_host": dph, "src": src, "dst": dst})


def test_sources_and_two_destination_programs_merge():
    picture = merge([member(0, SRC), member(0, SRC), member(2, dst=DST),
                     member(3, dst={"/w": {"ids": [6, 7], "axes": ["tp"], "spec": "RS0"}})])
    assert picture["src"] == SRC and sorted(picture["dst"]) == ["2", "3"]
    mesh, spec = placement_of(picture["src"][0][1], 2, 2)
    assert mesh.shape == (2, 2) and str(spec) == "S01R"
    mesh, spec = placement_of(picture["dst"]["2"]["/w"], 2, 2)
    assert str(spec) == "RS0" and sorted(mesh.hosts) == [2]


@pytest.mark.parametrize("members,message", [
    ([member(0, SRC), member(1, [["/w", dict(SRC[0][1], shape=[8, 8])]]), member(2, dst=DST)], "ranks [1] differ"),
    ([member(0, SRC), member(2, dst={"/v": DST["/w"]})], "rank 1's destination tree's leaves ['/v']"),
    ([member(0, dst=DST), member(2, dst=DST)], "passed the arrays to send"),
    ([member(0, SRC), member(1)], "passed destination shardings"),
    ([member(0, SRC), member(2, dst=DST, dph=4)], "same number of devices per process"),
    ([member(0, SRC), member(2, dst=DST), member(2, dst={"/w": dict(DST["/w"], pspec=["tp", None])})],
     "want different destination shardings"),
])
def test_disagreements_are_refused_with_the_ranks_named(members, message):
    with pytest.raises(InvalidOptionError, match=message.replace("[", r"\[").replace("]", r"\]")):
        merge(members)


@pytest.mark.parametrize("kw,message", [
    ({"buffers": "gpu"}, "buffers 'gpu' must be one of host, device"),
    ({"backend": "nccl", "buffers": "host"}, "needs buffers='device'"),
    ({"backend": "mpi"}, "backend 'mpi' is not available"),
    ({"nic_gbps": 0}, "nic_gbps must be a positive number"),
    ({"latency_s": -1}, "latency_s must be a number of seconds >= 0"),
])
def test_group_options_are_checked_before_anything_connects(kw, message):
    from alpa_comm.jax import ProcessGroup

    with pytest.raises(InvalidOptionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ProcessGroup(0, 1, address="127.0.0.1:1", **kw)


def test_carriers_keep_numpy_types_and_carry_the_rest_as_unsigned_bytes():
    import numpy as np

    from alpa_comm.jax.buffers import carrier
    from alpa_comm.runtime.executor import numpy_dtype

    assert carrier(np.dtype("float32")) == np.float32 and carrier(np.dtype("int8")) == np.int8
    assert carrier(numpy_dtype("bfloat16")) == np.uint16
