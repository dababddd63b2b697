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
