"""The pipeline trainer's transport on NCCL: one agreed order of a schedule's transfers
(``pipeline.transfer_order``) and the mailbox that keeps it (``train.transport.OrderedMailbox``),
run on the NCCL model (``alpa_comm.testing.nccl_model``) with the real ``NcclSubgroupBackend``,
stage hosts as threads, every received buffer bit-exact."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from torch.distributed import HashStore

from alpa_comm import ClusterSpec
from alpa_comm.pipeline.edges import edge_plans, model_edges, stage_hosts, with_skips
from alpa_comm.pipeline.generators import generate
from alpa_comm.pipeline.ir import Action, Schedule, ScheduleError
from alpa_comm.pipeline.transfer_order import transfer_order
from alpa_comm.resharding.host_job import HostJob
from alpa_comm.testing import nccl_model as M
from alpa_comm.train.transport import OrderedMailbox, ReshardMailbox, make_mailbox

from ranks import run_ranks


# --------------------------------------------------------------- the order itself
def _schedules():
    return st.builds(
        lambda kind, S, M_, split, delay, skip: (generate(kind, S, M_, split_backward=split or kind == "zb-h1",
                                                          delay_wgrad=delay if split and kind != "zb-h1" else None),
                                                 skip and S >= 3),
        st.sampled_from(["gpipe", "1f1b", "eager-1f1b", "zb-h1"]), st.integers(1, 5), st.integers(1, 6),
        st.booleans(), st.sampled_from([None, 1]), st.booleans())


def _serial_run_completes(schedule: Schedule, order: list) -> bool:
    """Play every stage's actions with each stage running its transfers one at a time in
    ``order`` (a SEND's transfer once the stage has reached that SEND; a RECV waits for
    its transfer): True when every stage reaches its end."""
    pos = [0] * schedule.num_stages
    sent, done = set(), set()
    mine = [[k for k in order if s in (k[2], k[3])] for s in range(schedule.num_stages)]
    nxt = [0] * schedule.num_stages
    moved = True
    while moved:
        moved = False
        for s, actions in enumerate(schedule.stages):  # the stages' main threads
            while pos[s] < len(actions):
                a = actions[pos[s]]
                if a.kind.is_send:
                    sent.add(schedule.transfer_key(s, a))
                elif a.kind.is_recv and schedule.transfer_key(s, a) not in done:
                    break
                pos[s] += 1
                moved = True
        for s in range(schedule.num_stages):  # their communication threads
            while nxt[s] < len(mine[s]):
                k = mine[s][nxt[s]]
                src, dst = k[2], k[3]
                ready = k in sent and all(mine[h][nxt[h]] == k for h in (src, dst) if nxt[h] < len(mine[h]))
                if not ready:
                    break
                done.add(k)
                nxt[src] += 1
                nxt[dst] += 1
                moved = True
    return all(p == len(a) for p, a in zip(pos, schedule.stages))


@settings(max_examples=60, deadline=None)
@given(_schedules())
def test_the_transfer_order_lets_every_schedule_run_to_its_end(case):
    schedule, skip = case
    if skip:
        schedule = with_skips(schedule, [(0, 2)])
    order = transfer_order(schedule)
    keys = {schedule.transfer_key(s, a) for s, acts in enumerate(schedule.stages) for a in acts if a.kind.is_comm}
    assert sorted(order, key=repr) == sorted(keys, key=repr)  # every transfer once
    at = {k: i for i, k in enumerate(order)}
    for s, actions in enumerate(schedule.stages):  # a stage's receives before its later sends
        received = []
        for a in actions:
            if a.kind.is_recv:
                received.append(at[schedule.transfer_key(s, a)])
            elif a.kind.is_send:
                assert all(r < at[schedule.transfer_key(s, a)] for r in received)
    assert _serial_run_completes(schedule, order)


def test_a_naive_order_would_deadlock_where_the_transfer_order_does_not():
    """The check above can fail: stage by stage in action order (stage 0's transfers
    first) leaves 1F1B stuck."""
    schedule = generate("1f1b", 3, 4)
    naive = sorted(transfer_order(schedule), key=lambda k: (k[0] == "B", k[1], k[2]))
    assert not _serial_run_completes(schedule, naive[::-1])
    assert _serial_run_completes(schedule, transfer_order(schedule))


def test_a_cycle_of_sends_and_receives_is_named():
    stages = ((Action("RECV_B", 0), Action("SEND_F", 0)), (Action("RECV_F", 0), Action("SEND_B", 0)))
    with pytest.raises(ScheduleError, match=r"cycle.*F:0->1 microbatch 0"):
        transfer_order(Schedule(stages))


# ------------------------------------------------------ the mailbox on the model
def _arrays(edges, shapes, num_microbatches):
    """The whole array each (edge, key, microbatch) carries, distinct everywhere."""
    out, base = {}, 0
    for e in edges:
        for key in e.keys:
            shape = shapes[(e.src if e.direction == "F" else e.dst, key)]
            for m in range(num_microbatches):
                n = int(np.prod(shape))
                out[(e.name, key, m)] = ((np.arange(n) + base) % 65_521).astype(np.float32).reshape(shape)
                base += n
    return out


def run_pipeline_transport(schedule: Schedule, consumes: list, dp: int, k: int, strategy: str, steps: int = 2,
                           tagged: bool = False, timeout: float = 20):
    """Every stage host a thread on the NCCL model with the real backend and the mailbox
    ``make_mailbox`` picks for it (``tagged``: the one for tagged transports instead);
    every RECV's buffers checked against what was sent."""
    S = schedule.num_stages
    rows = 4 * dp * k
    shapes = {(s, key): (rows, 6 + s) for s in range(S) for c in consumes for key, src in c.items() if src == s}
    edges = model_edges(consumes)
    cluster = ClusterSpec(num_hosts=S * dp, devices_per_host=k)
    plans = edge_plans(edges, shapes, "float32", dp, k, cluster, strategy)
    arrays = _arrays(edges, shapes, schedule.num_microbatches)
    edge_index = {e.name: i for i, e in enumerate(edges)}
    edge_keys = {e.name: list(e.keys) for e in edges}
    hosts = list(range(S * dp))
    store = HashStore()

    def host(h):
        import cupy  # the model's

        from alpa_comm.runtime.backend import NcclSubgroupBackend

        stage = h // dp
        backend = NcclSubgroupBackend(h, hosts, store, 0, timeout=timeout)
        jobs = {e.name: [HostJob.for_host(p, h) for p in plans[e]] for e in edges
                if h in stage_hosts(e.src, dp) or h in stage_hosts(e.dst, dp)}
        args = (h, backend, jobs, edge_index, edge_keys, k)
        io = dict(to_buffers=lambda shards: shards, from_buffers=lambda name, key, bufs: bufs,
                  alloc=lambda d, shape, dtype: cupy.empty(shape, dtype))
        if tagged:
            box = ReshardMailbox(*args, num_microbatches=schedule.num_microbatches, timeout=timeout, **io)
        else:
            box = make_mailbox(*args, schedule=schedule, stage=stage, timeout=timeout, **io)
            assert isinstance(box, OrderedMailbox)
        checked = 0
        for _ in range(steps):
            peer = schedule.peer
            for a in schedule.stages[stage]:
                if a.kind.is_recv:
                    box.post(a.kind[-1], peer(stage, a), stage, a.mb)
            for a in schedule.stages[stage]:
                if not a.kind.is_comm:
                    continue
                p = peer(stage, a)
                src, dst = (stage, p) if a.kind.is_send else (p, stage)
                name = f"{a.kind[-1]}:{src}->{dst}"
                if a.kind.is_send:
                    box.send(a.kind[-1], stage, p, a.mb,
                             {key: {d: cupy.asarray(b) for d, b in
                                    box.layouts[name][i][0].source_shards(arrays[(name, key, a.mb)],
                                                                          jobs[name][i].is_local).items()}
                              for i, key in enumerate(edge_keys[name])})
                    continue
                got = box.recv(a.kind[-1], p, stage, a.mb)
                for i, key in enumerate(edge_keys[name]):
                    lay = box.layouts[name][i][0]
                    whole = arrays[(name, key, a.mb)]
                    for d, buf in got[key].items():
                        want = whole[tuple(slice(lo, hi) for lo, hi in lay.dst_boxes[d])]
                        assert np.array_equal(np.asarray(buf).view(np.ndarray), want), (h, name, key, a.mb, d)
                        checked += 1
            box.flush()
        box.close()
        backend.close()
        return checked

    with M.install():
        checked = run_ranks(len(hosts), host, timeout=6 * timeout)
    assert sum(checked) > 0
    return checked


CHAIN3 = [{}, {"x": 0}, {"x": 1}]
SKIPS4 = [{}, {"x": 0}, {"x": 1, "skip": 0}, {"x": 2}]


@pytest.mark.parametrize("kind,split,delay", [("gpipe", False, None), ("1f1b", False, None),
                                              ("eager-1f1b", True, 1), ("zb-h1", True, None)])
@pytest.mark.parametrize("strategy", ["broadcast", "send_recv"])
def test_the_pipeline_transport_is_bit_exact_on_the_nccl_model(kind, split, delay, strategy):
    schedule = generate(kind, 3, 4, split_backward=split, delay_wgrad=delay)
    run_pipeline_transport(schedule, CHAIN3, dp=1, k=2, strategy=strategy)


def test_the_pipeline_transport_with_skips_and_data_parallel_hosts_on_the_nccl_model():
    """U-Transformer-like skip (stage 0 -> 2) and two data-parallel hosts per stage."""
    schedule = with_skips(generate("eager-1f1b", 4, 3, split_backward=True, delay_wgrad=1), [(0, 2)])
    run_pipeline_transport(schedule, SKIPS4, dp=2, k=2, strategy="broadcast")


def test_the_tagged_mailbox_fails_on_the_nccl_model():
    """What the trainer did on every backend: every RECV of a step posted at once on threads.
    On NCCL the hosts then issue their transfers in whatever order their threads reach
    them, and the model catches it (a peer named in a timeout, a deadlock or a mismatch)."""
    with pytest.raises(AssertionError, match="CommunicationError|NcclDeadlock|NcclMismatch|bit|array_equal"):
        run_pipeline_transport(generate("1f1b", 3, 4), CHAIN3, dp=1, k=2, strategy="broadcast", steps=1,
                               tagged=True, timeout=3)
