"""The Karpenter model's scheduling simulation and provisioning passes, as Karpenter v1.9.0's code runs them
(disruption/helpers.go SimulateScheduling, provisioning/scheduling/scheduler.go and queue.go, provisioner.go
Schedule, batcher.go): what the calibration against the real Karpenter on the loopback cluster found the model
doing differently (docs/benchmarks.md, issue 40)."""

from __future__ import annotations

import math

import pytest

from gpupolicy.capacity.instances import InstanceType
from gpupolicy.packing.nodemodel import PodDemand
from simulator.capacity import Cluster, PodRun, run
from simulator.capacity_baselines import EMPTINESS, Batcher, Karpenter, first_gpus
from simulator.capacity_trace import TimedPod

T2 = InstanceType("t2", "T4", 2, 104000, 524288, 1.732)
P1 = InstanceType("p1", "P100", 1, 8000, 61440, 1.522)
Q4 = InstanceType("q4", "V100", 4, 32000, 131072, 12.432)
TYPES = [T2, P1, Q4]


def pod(name: str, cpu: int, at: float = 0.0, seconds: float = 3600.0) -> TimedPod:
    return TimedPod(name, PodDemand(cpu_milli=cpu, memory_mib=8192, num_gpu=1, gpu_milli=1000, name=name), at,
                    seconds)


def node(cluster: Cluster, kind: InstanceType, *pods: TimedPod, ready: bool = True) -> int:
    row = cluster.launch(kind, 0.0)
    if ready:
        cluster.make_ready(row, cluster.delay)
    for p in pods:
        r = PodRun(p, p.duration)
        cluster.bind(r, row, first_gpus(cluster.state, row, p.demand), cluster.delay)
    return row


def test_pending_and_moving_pods_share_one_queue_largest_first() -> None:
    """A T2 holding a 12-core pod; another T2 with one free GPU and 14 free cores; a 2-core pod pending for an
    in-flight P1. Karpenter queues the 12-core pod first, onto that free GPU, and the pending pod onto the
    in-flight P1 (a pending pod may land on a node not yet initialized): the T2 can be deleted. With the
    pending pods placed first (the model before), the 2-core pod took that GPU and the 12-core pod had no
    room, and no cheaper node than a T2 holds it: no consolidation."""
    cluster = Cluster(TYPES, 18.0, None)
    candidate = node(cluster, T2, pod("big", 12000))
    node(cluster, T2, pod("other", 90000))
    node(cluster, P1, ready=False)
    cluster.pending["waiting"] = PodRun(pod("waiting", 2000), 3600.0)
    assert Karpenter(instance_types=TYPES)._simulation(cluster, set())([candidate]) == (True, None)


def test_a_candidate_whose_pod_only_fits_a_node_not_yet_initialized_stays() -> None:
    cluster = Cluster(TYPES, 18.0, None)
    one = node(cluster, T2, pod("a", 4000))
    later = node(cluster, T2, ready=False)
    k = Karpenter(instance_types=TYPES)
    assert k._simulation(cluster, set())([one]) == (False, None)
    cluster.make_ready(later, 18.0)
    assert k._simulation(cluster, set())([one]) == (True, None)


def test_pending_pods_that_need_a_new_node_turn_a_deletion_into_at_most_a_replacement() -> None:
    """Karpenter simulates the pending pods too: a deletion must leave no new NodeClaim, so pending pods no node
    holds make it a replacement by one cheaper node (here a P1 for the 2-core pod) or nothing."""
    cluster = Cluster(TYPES, 18.0, None)
    one = node(cluster, T2, pod("a", 4000))
    node(cluster, T2, pod("b", 4000))
    k = Karpenter(instance_types=TYPES)
    assert k._simulation(cluster, set())([one]) == (True, None)
    cluster.pending["w1"] = PodRun(pod("w1", 2000), 3600.0)  # takes the free GPU of the other T2
    assert k._simulation(cluster, set())([one]) == (True, P1)
    cluster.pending["w2"] = PodRun(pod("w2", 2000), 3600.0)
    cluster.pending["w3"] = PodRun(pod("w3", 2000), 3600.0)  # three GPUs needed: one new node is a Q4
    assert k._simulation(cluster, set())([one]) == (False, None)


def test_the_batcher_closes_a_window_after_its_idle_time_or_its_longest() -> None:
    b = Batcher(idle=0.5, longest=2.0)
    assert b.closes([0.8], 1.0) == []  # open until 1.3
    assert b.closes([1.2], 2.0) == [1.7]  # 1.2 came within 0.5 s: one window, closed 0.5 s after it
    assert b.closes([3.0, 3.4, 3.8, 4.2, 4.6, 5.0, 5.4], 6.0) == [5.0, 5.9]  # 2 s after opening at 3.0
    assert b.closes([], 7.0) == [] and b.opened is None


def test_a_pass_takes_the_pods_of_one_window_together_across_a_loop() -> None:
    """Three 1-GPU pods 0.4 s apart, the first just before a 1 s loop: one batch window (0.5 s idle), so one
    pass packs them together on one new NodeClaim, which only the 4-GPU type holds; pods 3 s apart are three
    passes. The real Karpenter bought the $12.43/h V100 x4 for such batches on the loopback cluster."""
    def launches(times: list[float]) -> list[str]:
        events: list[tuple[object, ...]] = []
        k = Karpenter(instance_types=[T2, Q4], batch_idle=0.5, batch_max=2.0)
        run([pod(f"p{i}", 8000, t) for i, t in enumerate(times)], [T2, Q4], k, delay=18.0, events=events,
            loop=1.0)
        return [str(e[3]) for e in events if e[1] == "launch"]

    assert launches([0.8, 1.2, 1.6]) == ["q4"]
    assert sorted(launches([0.8, 3.8, 6.8])) == ["t2", "t2"]


def test_the_loop_must_be_a_sensible_number_of_seconds() -> None:
    for bad in (0.0, -1.0, math.nan, 7200.0):
        with pytest.raises(ValueError, match=r"--loop must be from 0\.1 to 3600 seconds"):
            run([pod("a", 1000)], TYPES, Karpenter(instance_types=TYPES), loop=bad)


def test_the_disruption_loop_waits_10_s_after_finding_nothing() -> None:
    """disruption/controller.go: a loop that found nothing polls again after 10 s, even if the cluster changed."""
    cluster = Cluster(TYPES, 18.0, None)
    node(cluster, T2, pod("a", 4000), pod("b", 4000))
    k = Karpenter(instance_types=TYPES)
    assert k.disrupt(cluster, 100.0) == [] and k.validating is None and k.poll_at == 110.0
    node(cluster, T2)  # an empty node appears at once
    assert k.disrupt(cluster, 105.0) == [] and k.validating is None
    assert k.disrupt(cluster, 110.0) == [] and k.validating is not None and k.validating.method == EMPTINESS
