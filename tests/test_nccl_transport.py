"""The pipeline trainer's transport on NCCL: one agreed order of a schedule's transfers
(``pipeline.transfer_order``) and the mailbox that keeps it (``train.transport.OrderedMailbox``),
run on the NCCL model (``alpa_comm.testing.nccl_model``) with the real ``NcclSubgroupBackend``,
stage hosts as threads, every received buffer bit-exact."""
import pytest
from hypothesis import given, settings, strategies as st

from alpa_comm.pipeline.edges import with_skips
from alpa_comm.pipeline.generators import generate
from alpa_comm.pipeline.ir import Action, Schedule, ScheduleError
from alpa_comm.pipeline.transfer_order import transfer_order
from alpa_comm.testing import nccl_model as M
from alpa_comm.testing.pipeline_transport import CHAIN3, SKIPS4, run_pipeline_transport


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
@pytest.mark.parametrize("kind,split,delay", [("gpipe", False, None), ("1f1b", False, None),
                                              ("eager-1f1b", True, 1), ("zb-h1", True, None)])
@pytest.mark.parametrize("strategy", ["broadcast", "send_recv"])
def test_the_pipeline_transport_is_bit_exact_on_the_nccl_model(kind, split, delay, strategy):
    schedule = generate(kind, 3, 4, split_backward=split, delay_wgrad=delay)
    with M.install():
        run_pipeline_transport(schedule, CHAIN3, dp=1, k=2, strategy=strategy)


def test_the_pipeline_transport_with_skips_and_data_parallel_hosts_on_the_nccl_model():
    """U-Transformer-like skip (stage 0 -> 2) and two data-parallel hosts per stage."""
    schedule = with_skips(generate("eager-1f1b", 4, 3, split_backward=True, delay_wgrad=1), [(0, 2)])
    with M.install():
        run_pipeline_transport(schedule, SKIPS4, dp=2, k=2, strategy="broadcast")


def test_the_tagged_mailbox_fails_on_the_nccl_model():
    """What the trainer did on every backend: every RECV of a step posted at once on threads.
    On NCCL the hosts then issue their transfers in whatever order their threads reach
    them, and the model catches it (a peer named in a timeout, a deadlock or a mismatch)."""
    with M.install(), pytest.raises(AssertionError, match="CommunicationError|NcclDeadlock|NcclMismatch|differ"):
        run_pipeline_transport(generate("1f1b", 3, 4), CHAIN3, dp=1, k=2, strategy="broadcast", steps=1,
                               tagged=True, timeout=3)
