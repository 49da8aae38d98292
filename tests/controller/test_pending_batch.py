"""Pods kube-scheduler gave up on wake the capacity pass, batched as Karpenter batches its launches
(controller/pendingbatch.py): due one second after the last such pod, never later than ten seconds after the
first of a batch, never later than its own period; other pod changes wake nothing."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from controller.context import ControllerContext
from controller.loop import ReconcileRunner
from controller.pendingbatch import PendingBatch
from controller.policies import PolicyStore
from controller.recorder import ControllerMetrics, Recorder
from gpupolicy.model import Mode
from tests.controller.conftest import FakeClock


class Counting:
    """A reconciler that counts its passes (no API call)."""

    def __init__(self, name: str, period: float) -> None:
        self.name, self.period_seconds, self.runs = name, period, 0

    def reconcile(self, ctx: ControllerContext) -> None:
        self.runs += 1


def unschedulable(name: str, node: str | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ml"}, "spec": {"nodeName": node} if node else {},
            "status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}}


def runner_with(clock: FakeClock) -> tuple[ReconcileRunner, Counting, Counting]:
    ctx = ControllerContext(api=None, namespace="kubeon-gpu", default_mode=Mode.RECOMMEND, prometheus_url=None,
                            metrics=None, clock=clock, recorder=Recorder(None, ControllerMetrics(), clock),
                            policies=PolicyStore(), is_leader=lambda: True)
    capacity, layout = Counting("capacity", 10.0), Counting("layout", 20.0)
    return ReconcileRunner(ctx, [capacity, layout]), capacity, layout


def test_a_burst_of_unschedulable_pods_wakes_the_capacity_pass_once_a_second_after_the_last() -> None:
    clock = FakeClock()
    runner, capacity, layout = runner_with(clock)
    runner._run_one = lambda r: r.reconcile(runner.ctx)  # type: ignore[method-assign]  # no status write
    runner.run_due()
    assert (capacity.runs, layout.runs) == (1, 1)
    batch = PendingBatch(lambda when: runner.due_at("capacity", when), clock.now)
    for i in range(4):  # a Deployment's replicas, 0.3 s apart
        batch.on_pod("MODIFIED", unschedulable(f"p{i}"))
        clock.advance(0.3)
        assert runner.run_due() == 0
    clock.advance(0.75)  # 1 s after the last
    assert runner.run_due() == 1 and (capacity.runs, layout.runs) == (2, 1)


def test_a_stream_of_unschedulable_pods_still_runs_the_pass_at_least_every_ten_seconds() -> None:
    """Each pod pushes the batch's end a second on (a burst is planned once), but a pod every half second
    never holds the pass back past ten seconds from its batch's first pod, nor past its period."""
    clock = FakeClock()
    runner, capacity, _layout = runner_with(clock)
    ran_at: list[float] = []
    runner._run_one = lambda r: (r is capacity and ran_at.append(clock.now()), r.reconcile(runner.ctx))  # type: ignore
    runner.run_due()
    clock.advance(5.0)
    batch = PendingBatch(lambda when: runner.due_at("capacity", when), clock.now)
    for _ in range(60):
        batch.on_pod("ADDED", unschedulable("p"))
        clock.advance(0.5)
        runner.run_due()
    gaps = [b - a for a, b in pairwise(ran_at)]
    assert len(ran_at) >= 4 and max(gaps) <= 10.0 + 1e-9, ran_at


def test_pods_bound_deleted_or_merely_pending_wake_nothing() -> None:
    woken: list[float] = []
    batch = PendingBatch(woken.append, lambda: 0.0)
    batch.on_pod("MODIFIED", unschedulable("bound", node="n1"))
    batch.on_pod("DELETED", unschedulable("gone"))
    batch.on_pod("ADDED", {"metadata": {"name": "new"}, "spec": {}, "status": {}})
    assert woken == []
