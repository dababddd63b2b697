"""alpa_comm's own TCP transport (``runtime.tcp``) and gathered messages (``Pieces``):
messages match by tag whatever the posting order, striped and whole, gathered from many
buffers and scattered into many; a late receive still gets its message; errors name the
host (a wrong size, a timeout, a closed peer, a member that never comes); and every plan
kind runs bit-exact over it with buckets sent straight from the source shards."""
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from exactness import run_tree
from ranks import exchange_in_opposite_orders, run_ranks
from test_tree import CLUSTER as TREE_CLUSTER, small_leaves, trees

torch = pytest.importorskip("torch")

from alpa_comm.runtime.backend import STRIPE_MIN_BYTES, CommunicationError  # noqa: E402
from alpa_comm.runtime.pieces import Pieces  # noqa: E402
from alpa_comm.runtime.tcp import TcpBackend  # noqa: E402


def group(n: int, streams: int = 1, timeout: float = 20, pace_gbps=None):
    import torch.distributed as dist

    store = dist.PrefixStore("tcp", dist.HashStore())
    return run_ranks(n, lambda rank: TcpBackend(rank, range(n), store, timeout=timeout, streams=streams,
                                                pace_gbps=pace_gbps))


def close(backends):
    for b in backends:
        b.close()


def fails_at_once(handle, end, match: str) -> None:
    """``end()`` (closing a peer) fails ``handle`` with ``match`` at once, not after the
    wait's timeout."""
    t0 = time.monotonic()
    end()
    with pytest.raises(CommunicationError, match=match):
        handle.wait(10)
    assert time.monotonic() - t0 < 5


# ------------------------------------------------------------------ Pieces
@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=0, max_size=8), st.data())
def test_pieces_cut_like_the_packed_buffer(sizes, data):
    rng = np.random.default_rng(len(sizes))
    runs = [rng.integers(0, 256, n, dtype=np.uint8) for n in sizes]
    pieces, flat = Pieces(runs), np.concatenate(runs) if runs else np.zeros(0, np.uint8)
    assert pieces.nbytes == flat.size and np.array_equal(pieces.packed(), flat)
    lo = data.draw(st.integers(0, flat.size))
    hi = data.draw(st.integers(lo, flat.size))
    cut = pieces[lo:hi]
    assert cut.nbytes == hi - lo and np.array_equal(cut.packed(), flat[lo:hi])
    assert all(v.nbytes for v in cut.views)  # no empty runs travel
    into = [np.zeros(n, np.uint8) for n in sizes]
    Pieces(into)[lo:hi].scatter(flat[lo:hi])
    again = np.concatenate(into) if into else np.zeros(0, np.uint8)
    assert np.array_equal(again[lo:hi], flat[lo:hi]) and not again[:lo].any() and not again[hi:].any()


def test_pieces_refuse_what_cannot_travel_as_is():
    with pytest.raises(ValueError, match="contiguous flat uint8"):
        Pieces([np.zeros(8, np.float32)])
    with pytest.raises(ValueError, match="contiguous flat uint8"):
        Pieces([np.zeros(16, np.uint8)[::2]])
    with pytest.raises(TypeError, match="byte ranges"):
        Pieces([np.zeros(4, np.uint8)])[::2]


# ------------------------------------------------------------------ the transport
@pytest.mark.parametrize("streams", [1, 3])
def test_messages_match_by_tag_striped_whole_gathered_and_scattered(streams):
    a, b = group(2, streams)
    try:
        rng = np.random.default_rng(streams)
        sent, got = exchange_in_opposite_orders(a, b, [STRIPE_MIN_BYTES * 2 + 7, 1000, STRIPE_MIN_BYTES, 1], rng)
        assert all(np.array_equal(s, g) for s, g in zip(sent, got))
        # many buffers out as one message, into one buffer; one buffer into many (both ways)
        runs = [rng.integers(0, 256, n, dtype=np.uint8) for n in (3, 0, 5000, STRIPE_MIN_BYTES + 11, 1)]
        flat = np.zeros(sum(r.size for r in runs), np.uint8)
        h = a.irecv(flat, 1, 50)
        b.isend(Pieces(runs), 0, 50).wait(20)
        h.wait(20)
        assert np.array_equal(flat, np.concatenate(runs))
        into = [np.zeros_like(r) for r in runs]
        h = b.irecv(Pieces(into), 0, 51)
        a.isend(flat, 1, 51).wait(20)
        h.wait(20)
        assert all(np.array_equal(x, r) for x, r in zip(into, runs))
    finally:
        close([a, b])


def test_a_tag_used_again_matches_in_order_and_a_late_receive_gets_its_message():
    a, b = group(2)
    try:
        first, second = np.full(10, 1, np.uint8), np.full(10, 2, np.uint8)
        a.isend(first, 1, 7).wait(5)
        a.isend(second, 1, 7).wait(5)
        time.sleep(0.05)  # both arrived before anything was posted for them
        x, y = np.zeros(10, np.uint8), np.zeros(10, np.uint8)
        b.irecv(x, 0, 7).wait(5)
        b.irecv(y, 0, 7).wait(5)
        assert (x == 1).all() and (y == 2).all()
    finally:
        close([a, b])


def test_a_wrong_size_is_named_and_the_stream_stays_in_step():
    a, b = group(2)
    try:
        h = b.irecv(np.zeros(8, np.uint8), 0, 3)
        a.isend(np.ones(12, np.uint8), 1, 3)
        with pytest.raises(CommunicationError, match=r"host 1: receiving from host 0 failed: .*12 bytes.*8 were"):
            h.wait(5)
        ok = np.zeros(4, np.uint8)
        h = b.irecv(ok, 0, 4)
        a.isend(np.full(4, 9, np.uint8), 1, 4)
        h.wait(5)
        assert (ok == 9).all()
    finally:
        close([a, b])


def test_a_timeout_and_a_closed_peer_name_the_host():
    a, b = group(2)
    with pytest.raises(CommunicationError, match=r"host 1: receiving from host 0 timed out after 0.2 s \(tag 99"):
        b.irecv(np.zeros(5, np.uint8), 0, 99).wait(0.2)
    fails_at_once(b.irecv(np.zeros(5, np.uint8), 0, 100), a.close, "host 1: receiving from host 0 failed: host 0 closed")
    with pytest.raises(CommunicationError, match="host 0"):
        b.isend(np.zeros(5, np.uint8), 0, 101).wait(5)
    b.close()


def test_a_member_that_never_comes_is_named():
    import torch.distributed as dist

    with pytest.raises(CommunicationError, match=r"host 1 did not join"):
        TcpBackend(0, [0, 1], dist.HashStore(), timeout=0.5)
    with pytest.raises(ValueError, match="streams"):
        TcpBackend(0, [0], dist.HashStore(), streams=0)
    with pytest.raises(ValueError, match="pace_gbps must be a positive number of Gbit/s or None, got -1"):
        TcpBackend(0, [0], dist.HashStore(), pace_gbps=-1)


def test_a_read_only_receive_buffer_is_named_with_its_peer_and_tag():
    backends = group(2)
    try:
        buf = np.zeros(16, np.uint8)
        buf.flags.writeable = False
        with pytest.raises(CommunicationError, match=r"host 0: receiving from host 1 with tag 7: .*writable"):
            backends[0].irecv(buf, 1, 7)
    finally:
        close(backends)


def test_connections_are_paced_at_twice_the_nic_rate():
    """A host's connections leave paced (TCP's own pacing), not a window at a time: see
    ``PACE_FACTOR``. The cap reads back from every socket; data still arrives whole."""
    import socket
    import struct

    from alpa_comm.runtime.tcp import PACE_FACTOR, SO_MAX_PACING_RATE

    backends = group(2, streams=2, pace_gbps=0.4)
    try:
        for b in backends:
            for stream in b._streams.values():
                rate = struct.unpack("Q", stream.sock.getsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, 8))[0]
                assert rate == int(PACE_FACTOR * 0.4e9 / 8)
        x, y = np.arange(1 << 18, dtype=np.float32), np.zeros(1 << 18, np.float32)
        run_ranks(2, lambda r: backends[0].send(x, 1, 7, 10) if r == 0 else backends[1].recv(y, 0, 7, 10))
        assert np.array_equal(x, y)
    finally:
        close(backends)


def test_barrier_and_all_reduce_over_three_hosts():
    backends = group(3)
    try:
        run_ranks(3, lambda r: backends[r].barrier(5))
        arrays = [np.arange(10, dtype=np.float32) * (r + 1) for r in range(3)]
        run_ranks(3, lambda r: backends[r].allreduce_sum(arrays[r], [0, 1, 2], tag_base=1000, timeout=5))
        assert all(np.array_equal(a, np.arange(10, dtype=np.float32) * 6) for a in arrays)
    finally:
        close(backends)


# ------------------------------------------------------------------ plans over it
class TcpHosts:
    """A ``backend_class`` for ``execute_tree_in_threads``: each host thread joins one TCP
    group of the hosts that run (``ThreadHub.hosts``); ``made`` keeps them to close."""

    def __init__(self, streams: int = 2):
        import torch.distributed as dist

        self.store, self.streams, self.made = dist.HashStore(), streams, []
        self._lock = threading.Lock()

    def __call__(self, host, hub):
        import torch.distributed as dist

        b = TcpBackend(host, hub.hosts, dist.PrefixStore(f"run{id(hub)}", self.store), timeout=20,
                       streams=self.streams)
        with self._lock:
            self.made.append(b)
        return b

    def close(self):
        close(self.made)


@settings(max_examples=15, deadline=None)
@given(st.data())
def test_random_trees_are_bit_exact_over_tcp_with_gathered_buckets(data):
    from alpa_comm.resharding.tree import plan_resharding_tree

    tree = data.draw(trees())
    strategy = data.draw(st.sampled_from(["broadcast", "send_recv", "double_tree", "rotated_chains", "auto"]))
    plan = plan_resharding_tree(tree, cluster=TREE_CLUSTER, bucket_bytes=data.draw(st.sampled_from(["auto", 1024])),
                                strategy=strategy, loadbalance="greedy")
    hosts = TcpHosts(streams=data.draw(st.integers(1, 3)))
    try:
        run_tree(plan, backend_class=hosts)
    finally:
        hosts.close()


def test_a_bucket_leaves_from_the_shards_without_packing(monkeypatch):
    """Over a transport that gathers, a coalesced sender packs nothing: the bucket's parts
    go out as ``Pieces`` of the shards' own memory."""
    from alpa_comm.resharding.tree import plan_resharding_tree
    from alpa_comm.runtime import executor
    from alpa_comm.topology import ClusterSpec

    plan = plan_resharding_tree(small_leaves(40, 4096), cluster=ClusterSpec(num_hosts=2, devices_per_host=4),
                                bucket_bytes=1 << 20)
    assert any(t.parts for t in plan.transfers)
    packed, sent = [], []
    monkeypatch.setattr(executor.HostExecutor, "_pack", lambda self, t, progress=None: packed.append(t.id))
    real = TcpBackend.isend
    monkeypatch.setattr(TcpBackend, "isend", lambda self, buf, peer, tag, **kw: sent.append(type(buf)) or real(
        self, buf, peer, tag, **kw))
    hosts = TcpHosts()
    try:
        run_tree(plan, backend_class=hosts)
    finally:
        hosts.close()
    assert not packed and Pieces in sent


def _with_fake_peer():
    """A real backend as host 1 of a two-host group and a bare socket joined as host 0
    that then does what the test says (a member connects to those above it, so host 1
    accepts it)."""
    import socket

    import torch.distributed as dist

    from alpa_comm.runtime.tcp import HELLO

    store = dist.HashStore()
    made = {}
    t = threading.Thread(target=lambda: made.setdefault("b", TcpBackend(1, [0, 1], store, timeout=5)))
    t.start()
    store.wait(["tcp/1"])
    ip, _, port = store.get("tcp/1").decode().rpartition(":")
    peer = socket.create_connection((ip, int(port)))
    peer.sendall(HELLO.pack(0, 0))
    t.join()
    return made["b"], peer


def test_a_receive_given_up_mid_message_gets_no_later_bytes_and_ends_the_stream():
    from alpa_comm.runtime.tcp import HEADER

    b, peer = _with_fake_peer()
    try:
        buf = np.zeros(100, np.uint8)
        h = b.irecv(buf, 0, 5)
        peer.sendall(HEADER.pack(5, 100) + bytes([7]) * 10)  # ten bytes, then the peer stalls
        with pytest.raises(CommunicationError, match="host 1: receiving from host 0 timed out"):
            h.wait(0.3)
        peer.sendall(bytes([7]) * 90)
        time.sleep(0.1)
        assert not buf[10:].any()  # nothing landed after the caller gave up
        with pytest.raises(CommunicationError, match="host 1: receiving from host 0 failed"):
            b.irecv(np.zeros(4, np.uint8), 0, 6).wait(5)  # the stream is gone, said at once
    finally:
        peer.close()
        b.close()


def test_a_peer_that_dies_mid_message_fails_the_receive_at_once():
    from alpa_comm.runtime.tcp import HEADER

    b, peer = _with_fake_peer()
    try:
        h = b.irecv(np.zeros(1000, np.uint8), 0, 5)
        peer.sendall(HEADER.pack(5, 1000) + bytes(10))
        time.sleep(0.05)
        fails_at_once(h, peer.close, "host 1: receiving from host 0 failed")
    finally:
        b.close()


class DictKV:
    """A key-value store like the group's (``set``, ``get`` with a timeout,
    ``set_if_absent``), in memory, shared by the ranks' threads."""

    def __init__(self):
        self.data, self.cond = {}, threading.Condition()

    def set(self, key, value):
        with self.cond:
            if key in self.data:
                raise KeyError(f"{key} already exists")
            self.data[key] = value
            self.cond.notify_all()

    def get(self, key, timeout):
        with self.cond:
            if not self.cond.wait_for(lambda: key in self.data, timeout):
                raise TimeoutError(key)
            return self.data[key]

    def set_if_absent(self, key, value):
        with self.cond:
            return self.data.setdefault(key, value)


def test_tcp_subgroups_meet_in_the_groups_own_store_and_start_afresh_after_a_failure():
    """No torch store: the members publish their addresses in the group's key-value store;
    the first failure recorded is the one every member reports; a discarded subgroup is
    closed (its peer's next call on it fails at once) and the next call joins a new one."""
    from alpa_comm.jax.group import ProcessGroup

    kv = DictKV()
    groups = [ProcessGroup(r, 2, backend="tcp", _kv=kv, timeout=10) for r in range(2)]
    first = run_ranks(2, lambda r: groups[r].backend({0, 1}))
    assert all(isinstance(b, TcpBackend) for b in first)
    got = np.zeros(8, np.uint8)
    h = first[1].irecv(got, 0, 1)
    first[0].isend(np.arange(8, dtype=np.uint8), 1, 1).wait(5)
    h.wait(5)
    assert np.array_equal(got, np.arange(8))
    assert first[0].report_failure("host 0: first") == "host 0: first"
    assert first[1].report_failure("host 1: second") == "host 0: first"
    groups[1].discard({0, 1})
    with pytest.raises(CommunicationError, match="host 0: receiving from host 1 failed"):
        first[0].irecv(np.zeros(1, np.uint8), 1, 2).wait(5)
    groups[0].discard({0, 1})
    again = run_ranks(2, lambda r: groups[r].backend({0, 1}))
    assert again[0] is not first[0]
    h = again[1].irecv(got, 0, 1)
    again[0].isend(np.full(8, 3, np.uint8), 1, 1).wait(5)
    h.wait(5)
    assert (got == 3).all()
    for g in groups:
        g.close()


@pytest.fixture(scope="module")
def tcp_pair():
    backends = group(2, streams=3)
    yield backends
    close(backends)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3 * STRIPE_MIN_BYTES // 2), st.integers(1, 4), st.integers(1, 4)),
                min_size=1, max_size=8),
       st.randoms(use_true_random=False), st.booleans(), st.booleans())
def test_any_posting_order_any_cut_delivers_every_message_bit_exact(tcp_pair, messages, rnd, receives_first,
                                                                    rendezvous):
    """Messages of any size (some striped), each sent from and received into buffers cut
    at random places, with the sends and the receives posted in independent random orders
    (receives before or after the bytes come), all arrive whole and in the right place;
    a tag used twice in one round matches in the order sent; with ``rendezvous`` the large
    ones wait for their receives, the rest go on meanwhile."""
    a, b = tcp_pair
    rng = np.random.default_rng(rnd.randrange(1 << 30))
    tags = [rnd.choice([7, 8, 9, 100 + i]) for i in range(len(messages))]  # some tags repeat

    def cut(buf, k):
        bounds = sorted({0, buf.size, *rng.integers(0, buf.size + 1, k - 1).tolist()})
        return Pieces([buf[lo:hi] for lo, hi in zip(bounds, bounds[1:])])

    sent = [rng.integers(0, 256, n, dtype=np.uint8) for n, _, _ in messages]
    got = [np.zeros(n, np.uint8) for n, _, _ in messages]
    by_tag: dict = {}
    for i, t in enumerate(tags):
        by_tag.setdefault(t, []).append(i)
    # per tag, receives are posted in send order (that is what matching in order means);
    # across tags any interleaving
    recv_order = [i for t in rnd.sample(list(by_tag), len(by_tag)) for i in by_tag[t]]
    sends, recvs = [], []

    def post_sends():
        for i in range(len(messages)):
            sends.append(a.isend(cut(sent[i], messages[i][1]), 1, tags[i], rendezvous=rendezvous))

    def post_recvs():
        for i in recv_order:
            recvs.append(b.irecv(cut(got[i], messages[i][2]), 0, tags[i], rendezvous=rendezvous))

    if receives_first:
        post_recvs()
        post_sends()
    else:
        post_sends()
        time.sleep(0.02)  # let some arrive before anyone asked for them
        post_recvs()
    for h in sends + recvs:
        h.wait(20)
    assert all(np.array_equal(s, g) for s, g in zip(sent, got))


def test_a_rendezvous_message_waits_for_its_receive_and_lets_others_pass():
    """A large rendezvous send posted before its receive is not read into a buffer of its
    own on arrival (it does not leave before the clear-to-send); a small message posted
    after it still goes at once; a receive that never comes ends in a timeout naming the
    host, and a peer that closes fails the waiting send at once."""
    from alpa_comm.runtime.tcp import RENDEZVOUS_MIN_BYTES

    a, b = group(2)
    try:
        big = np.arange(RENDEZVOUS_MIN_BYTES * 2, dtype=np.int64).view(np.uint8)[: RENDEZVOUS_MIN_BYTES * 2]
        sent = a.isend(big, 1, 5, rendezvous=True)
        small = a.isend(np.full(16, 7, np.uint8), 1, 6, rendezvous=True)
        got_small = np.zeros(16, np.uint8)
        b.irecv(got_small, 0, 6, rendezvous=True).wait(5)  # passes the large one waiting ahead of it
        small.wait(5)
        assert (got_small == 7).all()
        time.sleep(0.2)
        stream = b._streams[(0, 0)]
        assert not stream.early, "the large message came before its receive"
        got = np.zeros_like(big)
        b.irecv(got, 0, 5, rendezvous=True).wait(5)
        sent.wait(5)
        assert np.array_equal(got, big)
        # a later small message of the same tag does not pass the large one waiting: a tag's
        # messages match in the order sent
        first = a.isend(big, 1, 8, rendezvous=True)
        second = a.isend(np.full(16, 3, np.uint8), 1, 8, rendezvous=True)
        got_first, got_second = np.zeros_like(big), np.zeros(16, np.uint8)
        time.sleep(0.1)
        b.irecv(got_first, 0, 8, rendezvous=True).wait(5)
        b.irecv(got_second, 0, 8, rendezvous=True).wait(5)
        first.wait(5)
        second.wait(5)
        assert np.array_equal(got_first, big) and (got_second == 3).all()
        with pytest.raises(CommunicationError, match=r"host 0: sending to host 1 timed out after 0.3 s \(tag 9"):
            a.isend(big, 1, 9, rendezvous=True).wait(0.3)
        fails_at_once(a.isend(big, 1, 10, rendezvous=True), b.close, "host 0: sending to host 1 failed")
    finally:
        close([a, b])


@pytest.mark.parametrize("rendezvous", [False, True])
def test_threads_posting_at_once_both_ways_with_large_messages_deliver_in_order(tcp_pair, rendezvous):
    """Several threads on each end post sends at once, both directions, messages up to
    8 MiB (larger than a socket takes at once: a posting thread writes what it can without
    blocking and the sending thread finishes it before anything else), receives posted
    late on their own threads: every message arrives whole, a tag's in the order sent,
    and no posting thread blocks another's message."""
    a, b = tcp_pair
    rng = np.random.default_rng(11 + rendezvous)
    plans = {}  # (sender, thread) -> [(tag, bytes)]
    for side in (0, 1):
        for th in range(3):
            tag = 1000 + 10 * side + th  # one thread per tag: its order is the order sent
            plans[(side, th)] = [(tag, rng.integers(0, 256, int(rng.choice([7, 70_000, 3 << 20, 8 << 20])),
                                                    dtype=np.uint8)) for _ in range(4)]
    ends = (a, b)
    handles, got, errors = [], {}, []

    def post_sends(side, th):
        try:
            for tag, data in plans[(side, th)]:
                handles.append(ends[side].isend(data, 1 - side, tag, rendezvous=rendezvous))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    def post_recvs(side, th):
        try:
            time.sleep(0.05)
            for k, (tag, data) in enumerate(plans[(1 - side, th)]):
                into = np.zeros_like(data)
                got[(1 - side, th, k)] = into
                handles.append(ends[side].irecv(into, 1 - side, tag, rendezvous=rendezvous))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=f, args=(side, th)) for side in (0, 1) for th in range(3)
               for f in (post_sends, post_recvs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not errors
    for h in list(handles):
        h.wait(20)
    for (side, th, k), into in got.items():
        assert np.array_equal(into, plans[(side, th)][k][1]), (side, th, k)
