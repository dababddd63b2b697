"""Several gloo streams per pair: a large message is striped over every stream and a small
one rides one; both ends split alike, every byte arrives, and a bad count is refused."""
import numpy as np
import pytest
from ranks import exchange_in_opposite_orders, run_ranks

torch = pytest.importorskip("torch")

from alpa_comm.runtime.backend import STRIPE_MIN_BYTES, GlooSubgroupBackend, stream_of  # noqa: E402


def pair(streams: int):
    import torch.distributed as dist

    store = dist.HashStore()
    return run_ranks(2, lambda rank: GlooSubgroupBackend(rank, [0, 1], dist.PrefixStore("pair", store), timeout=20,
                                                         streams=streams))


@pytest.mark.parametrize("streams", [1, 3])
def test_striped_and_whole_messages_arrive_bit_exact(streams):
    a, b = pair(streams)
    rng = np.random.default_rng(streams)
    sent, got = exchange_in_opposite_orders(a, b, [STRIPE_MIN_BYTES * 2 + 7, 1000, STRIPE_MIN_BYTES, 1], rng)
    assert all(np.array_equal(s, g) for s, g in zip(sent, got))
    parts = a._stripes(sent[0], 0)
    assert len(parts) == streams and sum(p.nbytes for p, _ in parts) == sent[0].nbytes
    assert sorted(t % streams for _, t in parts) == list(range(streams))  # one part on each stream
    assert len(a._stripes(sent[1], 1)) == 1
    a.close()
    b.close()


@pytest.mark.parametrize("bad", [0, 9, 2.0, True])
def test_a_bad_stream_count_is_refused_by_name(bad):
    import torch.distributed as dist

    with pytest.raises(ValueError, match="streams"):
        GlooSubgroupBackend(0, [0], dist.HashStore(), streams=bad)


def test_auto_streams_follow_the_nic_rate():
    from alpa_comm.errors import InvalidOptionError
    from alpa_comm.jax.group import streams_for

    assert streams_for("auto", 0.4, 10.0) == 1 and streams_for("auto", 10.0, 10.0) == 1
    assert streams_for("auto", 40.0, 10.0) == 4 and streams_for("auto", 400.0, 10.0) == 8
    assert streams_for(3, 0.4, 10.0) == 3
    for bad in (0, 9, "two", 1.5):
        with pytest.raises(InvalidOptionError, match="streams"):
            streams_for(bad, 10.0, 10.0)
    with pytest.raises(InvalidOptionError, match="stream_gbps"):
        streams_for("auto", 10.0, 0)


def test_whole_messages_of_successive_transfers_spread_over_the_streams():
    """The executor's transfers are 1,024 tags apart (tag % streams would put every
    single-chunk transfer on stream 0): their whole messages use every stream, evenly."""
    for streams in (2, 3, 4, 8):
        used = [stream_of(k * 1024, streams) for k in range(64 * streams)]
        counts = [used.count(s) for s in range(streams)]
        assert min(counts) > 0.5 * max(counts), (streams, counts)
        assert [stream_of(k, streams) for k in range(100)] == [stream_of(k, streams) for k in range(100)]
