"""Each consolidation method alone, on a hand-made cluster (nothing faked: the packing engine re-places pods),
and the planner's order: what one method plans without the others before it."""

from __future__ import annotations

from dataclasses import replace

from gpupolicy.capacity.disruption import METHODS, ConsolidationRules, DisruptionInputs, plan_disruptions
from gpupolicy.capacity.disruption.emptiness import Emptiness
from gpupolicy.capacity.disruption.multinode import MultiNode
from gpupolicy.capacity.disruption.planning import Method, Planning
from gpupolicy.capacity.disruption.singlenode import SingleNode
from gpupolicy.capacity.disruption.underused import Underused
from gpupolicy.capacity.instances import InstanceType
from gpupolicy.packing.nodemodel import NodeState, PodDemand

T4X4 = InstanceType("t4x4", "T4", 4, 96000, 393216, 2.696)
P100X1 = InstanceType("p100x1", "P100", 1, 8000, 61440, 1.522)
V100X8 = InstanceType("v100x8", "V100M16", 8, 64000, 262144, 24.864)


def make_pod(name: str, gpus: int = 1) -> tuple[str, PodDemand]:
    return name, PodDemand(cpu_milli=4000, memory_mib=8192, num_gpu=gpus, gpu_milli=1000, name=name)


def t4_cluster(*gpus_per_node: list[int]) -> DisruptionInputs:
    """T4x4 nodes t4-0, t4-1, ... holding pods of these GPU counts (pod names n<node>p<i>)."""
    state = NodeState.build([T4X4.spec(f"t4-{i}") for i in range(len(gpus_per_node))])
    pods_on = {}
    for n, sizes in enumerate(gpus_per_node):
        pods, used = [make_pod(f"n{n}p{i}", g) for i, g in enumerate(sizes)], 0
        for _, demand in pods:
            state.place(n, demand, tuple(range(used, used + demand.num_gpu)))
            used += demand.num_gpu
        pods_on[n] = pods
    rules = ConsolidationRules(max_disrupted_nodes=2)
    return DisruptionInputs(state, pods_on, [T4X4.price_per_hour] * len(gpus_per_node), rules, now=0.0)


def run_alone(method: Method, ask: DisruptionInputs) -> list[tuple[str, tuple[int, ...], dict[str, int]]]:
    run = Planning(ask)
    method.plan(run)
    return [(d.method, d.nodes, d.moves) for d in run.out]


def test_the_methods_run_empty_underused_multi_node_single_node() -> None:
    assert [m.name for m in METHODS] == ["empty", "underused", "multi-node", "single-node"]
    assert [m.ends_pass for m in METHODS] == [False, False, True, True]


def test_emptiness_takes_empty_nodes_after_the_grace_and_never_busy_ones() -> None:
    ask = t4_cluster([1], [], [])
    ask = replace(ask, rules=ConsolidationRules(max_disrupted_nodes=2, empty_grace_seconds=60),
                empty_since={1: 0.0, 2: 30.0}, now=70.0)
    assert run_alone(Emptiness(), ask) == [("empty", (1,), {})]


def test_an_empty_node_a_pending_pod_fits_is_awaited_not_empty() -> None:
    """Found with real Karpenter (issue 43): it launched a node for a pending whole-GPU pod, and emptiness
    took the node in the seconds before kube-scheduler bound the pod there. A pending pod that fits an
    empty node keeps one such node (Karpenter's nominated node); one that fits none keeps nothing."""
    ask = replace(t4_cluster([], []), rules=ConsolidationRules(max_disrupted_nodes=2), empty_since={0: 0.0, 1: 0.0},
                  now=70.0)
    both = [("empty", (0,), {}), ("empty", (1,), {})]
    assert run_alone(Emptiness(), ask) == both
    waiting = [make_pod("waiting", 4)[1]]
    assert run_alone(Emptiness(), replace(ask, pending=waiting)) == [("empty", (1,), {})]
    assert run_alone(Emptiness(), replace(ask, pending=waiting * 2)) == []
    assert run_alone(Emptiness(), replace(ask, pending=[make_pod("too-big", 8)[1]])) == both
    assert [d.nodes for d in plan_disruptions(replace(ask, pending=waiting * 2))] == []


def test_underused_needs_a_usage_figure_below_the_threshold() -> None:
    ask = t4_cluster([2], [1])
    assert run_alone(Underused(), ask) == []  # no usage: no candidate
    assert run_alone(Underused(), replace(ask, usage_percent={0: 50.0, 1: None})) == []
    assert run_alone(Underused(), replace(ask, usage_percent={0: 50.0, 1: 3.0})) == [("underused", (1,), {"n1p0": 0})]


def test_multi_node_takes_the_largest_set_that_re_places_at_once() -> None:
    ask = t4_cluster([1], [1], [1], [1])
    [(method, nodes, moves)] = run_alone(MultiNode(), replace(ask, rules=ConsolidationRules(max_disrupted_nodes=3)))
    assert method == "multi-node" and len(nodes) == 3 and set(moves.values()).isdisjoint(nodes)
    assert run_alone(MultiNode(), t4_cluster([3], [1])) == []  # one node alone is single-node's


def test_single_node_deletes_one_node_or_replaces_it_by_a_cheaper_one() -> None:
    assert run_alone(SingleNode(), t4_cluster([3], [1])) == [("single-node", (1,), {"n1p0": 0})]
    state = NodeState.build([V100X8.spec("v100-0")])
    key, demand = make_pod("small")
    state.place(0, demand, (0,))
    ask = DisruptionInputs(state, {0: [(key, demand)]}, [V100X8.price_per_hour], ConsolidationRules(), now=0.0,
                           instance_types=[T4X4, P100X1, V100X8])
    run = Planning(ask)
    SingleNode().plan(run)
    assert [(d.nodes, d.moves, [t.name for t in d.launches]) for d in run.out] == [((0,), {"small": 1}, ["p100x1"])]


def test_an_earlier_method_in_the_order_takes_the_node_first() -> None:
    ask = replace(t4_cluster([3], [1]), usage_percent={0: 50.0, 1: 3.0})
    assert [d.method for d in plan_disruptions(ask)] == ["underused"]
    assert [d.method for d in plan_disruptions(ask, methods=(SingleNode(), Underused()))] == ["single-node"]
