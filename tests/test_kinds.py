"""The transfer-kind registry: every kind answers every question the planner, the
simulator and the executor ask, and the lists derived from it stay in step."""
import pytest

from alpa_comm import STRATEGIES
from alpa_comm.errors import InvalidOptionError
from alpa_comm.resharding.kinds import PACKABLE_KINDS, PER_TASK_STRATEGIES, TRANSFER_KINDS, TransferKind, transfer_kind
from alpa_comm.resharding.tree import TREE_STRATEGIES

QUESTIONS = ("resources", "duration", "phases", "run")


@pytest.mark.parametrize("name", list(TRANSFER_KINDS))
def test_every_kind_answers_every_question(name):
    kind = TRANSFER_KINDS[name]
    assert kind.name == name and isinstance(kind, TransferKind)
    missing = [q for q in QUESTIONS if getattr(type(kind), q) is getattr(TransferKind, q)
               and not (q == "run" and type(kind).post is not TransferKind.post)]  # posting is running
    assert not missing, f"{name} does not define {missing}"


def test_derived_lists_follow_the_registry():
    assert set(PER_TASK_STRATEGIES) <= set(STRATEGIES) and {"alpa", "auto"} <= set(STRATEGIES)
    assert TREE_STRATEGIES == PER_TASK_STRATEGIES + ("auto",)
    assert set(PACKABLE_KINDS) <= set(PER_TASK_STRATEGIES)
    assert {"local_copy", "allgather"} <= set(TRANSFER_KINDS) - set(PER_TASK_STRATEGIES)


def test_cli_choices_come_from_the_registry():
    from alpa_comm.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for command in ("plan", "simulate", "train"):
        strategy = next(a for a in sub.choices[command]._actions if a.dest == "strategy")
        assert tuple(strategy.choices) == STRATEGIES


def test_an_unknown_kind_is_named():
    with pytest.raises(InvalidOptionError, match="'teleport'.*known kinds: send_recv"):
        transfer_kind("teleport")


def test_a_plan_with_an_unknown_kind_fails_in_the_executor_with_the_host_named():
    import numpy as np

    from alpa_comm import plan_resharding
    from alpa_comm.runtime.backend import CommunicationError
    from alpa_comm.runtime.local import execute_in_threads

    plan = plan_resharding((8, 8), "float32", "1x2@0", "RS1", "1x2@1", "RR")
    broken = type(plan)(**{**plan.__dict__, "transfers": tuple(t._replace(kind="teleport") for t in plan.transfers)})
    with pytest.raises(CommunicationError, match="host [01]: unknown transfer kind 'teleport'"):
        execute_in_threads(broken, np.zeros((8, 8), np.float32), timeout=5)


def _many_sends():
    from alpa_comm import ClusterSpec, plan_resharding

    cluster = ClusterSpec(num_hosts=2, devices_per_host=4)
    return plan_resharding((64, 32), "float32", "1x4@0", "S1R", "1x4@1", "RS1", cluster=cluster,
                           strategy="send_recv", bucket_bytes=None)  # every piece its own message


def test_a_kind_that_cannot_name_its_resources_runs_outside_the_windows(monkeypatch):
    """Ordering on a NIC is only an aid: a kind whose ``resources`` are not written
    (``NotImplementedError``) is admitted outside the windows and delivers all the same."""
    import numpy as np

    from alpa_comm.resharding.kinds.send_recv import SendRecv
    from alpa_comm.runtime.local import execute_in_threads

    from exactness import expect_exact

    plan = _many_sends()

    def cannot_say(self, sender_host, receiver_hosts):
        raise NotImplementedError

    monkeypatch.setattr(SendRecv, "resources", cannot_say)
    x = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
    expect_exact(plan, x, execute_in_threads(plan, x, timeout=10, max_per_resource=1))


def test_a_kind_whose_resources_fail_fails_the_run(monkeypatch):
    """Any other error of a kind's ``resources`` is a fault, raised by the run (not an
    order silently dropped)."""
    import numpy as np

    from alpa_comm.resharding.kinds.send_recv import SendRecv
    from alpa_comm.runtime.local import execute_in_threads

    plan = _many_sends()

    def broken(self, sender_host, receiver_hosts):
        raise KeyError(f"no NIC for host {sender_host}")

    monkeypatch.setattr(SendRecv, "resources", broken)
    with pytest.raises(KeyError, match="no NIC for host 0"):
        execute_in_threads(plan, np.zeros((64, 32), np.float32), timeout=5, max_per_resource=1)
