"""The capacity decision core on hand-made clusters: instance catalog, launches, disruptions."""

from __future__ import annotations

from typing import Any

import pytest

from gpupolicy.capacity.disruption import ConsolidationRules, Disruption, DisruptionInputs, plan_disruptions
from gpupolicy.capacity.instances import InstanceType, load_instances, parse_instances
from gpupolicy.capacity.provisioning import plan_launches, plan_provisioning
from gpupolicy.packing.nodemodel import NodeState, PodDemand

T4X4 = InstanceType("t4x4", "T4", 4, 96000, 393216, 2.696)
P100X1 = InstanceType("p100x1", "P100", 1, 8000, 61440, 1.522)
V100X8 = InstanceType("v100x8", "V100M16", 8, 64000, 262144, 24.864)
TYPES = [T4X4, P100X1, V100X8]


def gpu_pod(name: str, gpus: int = 1, milli: int = 1000, cpu: int = 4000) -> tuple[str, PodDemand]:
    return name, PodDemand(cpu_milli=cpu, memory_mib=8192, num_gpu=gpus, gpu_milli=milli, name=name)


def test_vendored_catalog_loads() -> None:
    types = load_instances("vendor/openb/instances.csv")
    assert len(types) == 15
    assert {t.model for t in types} >= {"G2", "T4", "V100M16"}


@pytest.mark.parametrize(("row", "message"), [
    ({"gpus": "x"}, "field 'gpus' is not an integer"),
    ({"price_per_hour": "-1"}, "field 'price_per_hour' must be a non-negative number"),
    ({"model": ""}, "field 'model' is empty"),
])
def test_bad_catalog_rows_name_row_and_field(row: dict[str, str], message: str) -> None:
    good = {"instance_type": "a", "model": "T4", "gpus": "2", "cpu_milli": "8000", "memory_mib": "1024",
            "price_per_hour": "1.0"}
    with pytest.raises(ValueError, match=f"cat.csv:3: {message}"):
        parse_instances([good, {**good, "instance_type": "b", **row}], "cat.csv")


def test_a_burst_of_pending_pods_launches_the_nodes_once() -> None:
    pending = [gpu_pod(f"p{i}") for i in range(50)]
    launches = plan_launches(pending, NodeState.build([]), [], TYPES)
    assert sum(len(launch.pods) for launch in launches) == 50
    assert sum(launch.instance_type.gpus for launch in launches) == 52  # 12 x T4x4 + one shrunk remainder
    assert all(launch.instance_type.model == "T4" for launch in launches)
    # the same pods, with those launches already requested: nothing more
    again = plan_launches(pending, NodeState.build([]), [launch.instance_type for launch in launches], TYPES)
    assert again == []


def test_pods_keep_the_spots_an_earlier_plan_reserved_and_only_new_pods_are_planned() -> None:
    # a, b, c were planned onto a launching T4x4 (GPUs 0, 1, 2); then d (2 GPUs) arrives. Planned from
    # scratch, d (largest first) takes two GPUs of that node and pushes a pod onto a new one; with the
    # reservations a, b, c keep their spots and only d is planned
    pending = [gpu_pod("a"), gpu_pod("b"), gpu_pod("c"), gpu_pod("d", 2)]
    scratch = plan_provisioning(pending, NodeState.build([]), [T4X4], TYPES)
    assert "d" in scratch.placed and len(scratch.launches) == 1 and "d" not in scratch.launches[0].pods
    reserved = {"a": (0, (0,)), "b": (0, (1,)), "c": (0, (2,))}
    kept = plan_provisioning(pending, NodeState.build([]), [T4X4], TYPES, reserved=reserved)
    assert kept.placed == reserved
    assert [(la.pods, la.gpus) for la in kept.launches] == [(("d",), ((0, 1),))]
    # a spot that no longer holds the pod (its row cordoned) is planned again
    state = NodeState.build([T4X4.spec("t4-0")])
    state.schedulable[0] = False
    again = plan_provisioning([gpu_pod("a")], state, [], TYPES, reserved={"a": (0, (0,))})
    assert again.placed == {} and [la.pods for la in again.launches] == [("a",)]


def test_pods_that_fit_on_existing_nodes_get_no_launch() -> None:
    state = NodeState.build([T4X4.spec("t4-a")])
    assert plan_launches([gpu_pod("a"), gpu_pod("b", 3)], state, [], TYPES) == []
    state.schedulable[0] = False  # cordoned: not capacity
    assert len(plan_launches([gpu_pod("a")], state, [], TYPES)) == 1


def test_max_gpus_caps_launches_and_unfit_pods_get_none() -> None:
    pending = [gpu_pod(f"p{i}", 4) for i in range(5)] + [gpu_pod("huge", 8, cpu=200000)]
    launches = plan_launches(pending, NodeState.build([]), [], TYPES, max_gpus=12)
    assert sum(launch.instance_type.gpus for launch in launches) <= 12
    assert all("huge" not in launch.pods for launch in launches)


def _cluster(*pods_per_node: list[tuple[str, PodDemand]]) -> tuple[NodeState, dict[int, list[tuple[str, PodDemand]]]]:
    state = NodeState.build([T4X4.spec(f"t4-{i}") for i in range(len(pods_per_node))])
    pods_on = {}
    for n, pods in enumerate(pods_per_node):
        used = 0
        for _key, demand in pods:
            state.place(n, demand, tuple(range(used, used + demand.num_gpu)))
            used += demand.num_gpu
        pods_on[n] = list(pods)
    return state, pods_on


def plan(state: NodeState, pods_on: dict[int, list[tuple[str, PodDemand]]], prices: list[float],
         usage: dict[int, float | None], rules: ConsolidationRules, **kw: Any) -> list[Disruption]:
    """plan_disruptions on these inputs (`kw`: the other fields of DisruptionInputs)."""
    return plan_disruptions(DisruptionInputs(state, pods_on, prices, rules, usage_percent=usage, **kw))


RULES = ConsolidationRules(underused_below_percent=10, window_seconds=7200, max_disrupted_nodes=2,
                           empty_grace_seconds=30)


def test_empty_node_goes_after_the_grace() -> None:
    state, pods_on = _cluster([gpu_pod("a")], [])
    prices = [T4X4.price_per_hour] * 2
    kw = {"blocked": set(), "empty_since": {1: 100.0}}
    assert [d.method for d in plan(state, pods_on, prices, {}, RULES, now=110.0, **kw)] == []
    plans = plan(state, pods_on, prices, {}, RULES, now=131.0, **kw)
    assert plans[0].method == "empty" and plans[0].nodes == (1,)


def test_single_node_moves_pods_where_they_fit_and_never_otherwise() -> None:
    state, pods_on = _cluster([gpu_pod("a", 3)], [gpu_pod("b")])
    prices = [T4X4.price_per_hour] * 2
    plans = plan(state, pods_on, prices, {}, RULES, blocked=set(), now=0.0, empty_since={})
    assert [(d.method, d.nodes, d.moves) for d in plans] == [("single-node", (1,), {"b": 0})]
    assert plans[0].explanation == "t4-1: 1 pod; it fits on t4-0; frees 4 GPUs, about $2.70/h"
    full, pods_full = _cluster([gpu_pod("a", 4)], [gpu_pod("b")])
    assert plan(full, pods_full, prices, {}, RULES, blocked=set(), now=0.0, empty_since={}) == []
    other = plan(state, pods_on, prices, {}, RULES, blocked={1}, now=0.0, empty_since={})
    assert [(d.nodes, d.moves) for d in other] == [((0,), {"a": 1})]  # blocked keeps t4-1, t4-0 moves onto it
    assert plan(state, pods_on, prices, {}, RULES, blocked={0, 1}, now=0.0, empty_since={}) == []


def test_multi_node_takes_several_nodes_at_once_within_the_budget() -> None:
    state, pods_on = _cluster([gpu_pod("a")], [gpu_pod("b")], [gpu_pod("c")], [gpu_pod("d")])
    prices = [T4X4.price_per_hour] * 4
    plans = plan(state, pods_on, prices, {}, RULES, blocked=set(), now=0.0, empty_since={})
    assert len(plans) == 1 and plans[0].method == "multi-node" and len(plans[0].nodes) == 2
    assert set(plans[0].moves.values()).isdisjoint(plans[0].nodes)


def test_underused_node_is_named_with_its_utilisation() -> None:
    state, pods_on = _cluster([gpu_pod("a", 2)], [gpu_pod("b")])
    prices = [T4X4.price_per_hour] * 2
    plans = plan(state, pods_on, prices, {0: 50.0, 1: 3.0}, RULES, blocked=set(), now=0.0,
                             empty_since={})
    assert plans[0].method == "underused" and plans[0].nodes == (1,)
    assert "GPU util 3% for 2h" in plans[0].explanation


def test_a_pod_evicted_max_times_pins_its_node() -> None:
    state, pods_on = _cluster([gpu_pod("a", 3)], [gpu_pod("b")])
    prices = [T4X4.price_per_hour] * 2
    free = plan(state, pods_on, prices, {}, RULES, blocked=set(), now=0.0, empty_since={},
                            evictions={"b": 2})
    assert [d.nodes for d in free] == [(1,)]
    pinned = plan(state, pods_on, prices, {}, RULES, blocked=set(), now=0.0, empty_since={},
                              evictions={"b": 3})
    assert [d.nodes for d in pinned] == [(0,)]  # t4-1 stays; t4-0's pod may still move onto it


def test_a_node_whose_pods_just_changed_waits_to_settle() -> None:
    state, pods_on = _cluster([gpu_pod("a", 3)], [gpu_pod("b")])
    prices = [T4X4.price_per_hour] * 2
    rules = ConsolidationRules(max_disrupted_nodes=1, settle_seconds=600)
    kw = {"blocked": set(), "empty_since": {}, "changed_at": {0: 950.0, 1: 900.0}}
    assert plan(state, pods_on, prices, {}, rules, now=1000.0, **kw) == []
    assert [d.nodes for d in plan(state, pods_on, prices, {}, rules, now=1500.0, **kw)] == [(1,)]


def test_an_expensive_node_is_replaced_by_cheaper_capacity() -> None:
    state = NodeState.build([V100X8.spec("v100-0")])
    key, demand = gpu_pod("small")
    state.place(0, demand, (0,))
    plans = plan(state, {0: [(key, demand)]}, [V100X8.price_per_hour], {}, RULES, blocked=set(),
                             now=0.0, empty_since={}, instance_types=TYPES)
    assert len(plans) == 1 and plans[0].method == "single-node"
    assert [t.name for t in plans[0].launches] == ["p100x1"] and plans[0].moves == {"small": 1}
    assert plans[0].savings_per_hour == pytest.approx(V100X8.price_per_hour - P100X1.price_per_hour)
    assert "replaced by p100x1" in plans[0].explanation


def test_a_node_is_a_candidate_once_its_youngest_pod_is_old_and_moves_go_beside_old_pods() -> None:
    # only nodes whose youngest pod ran an hour are candidates, and moved pods go only beside pods that old:
    # at 8000 s t4-0 (old) could move beside the young pods of t4-1 or t4-2 and does not; at 9500 s the
    # mover is old, t4-1's pod still young: the mover goes beside t4-0's old pod, never beside the young one
    state, pods_on = _cluster([gpu_pod("old", 2)], [gpu_pod("young", 2)], [gpu_pod("mover")])
    prices = [T4X4.price_per_hour] * 3
    rules = ConsolidationRules(max_disrupted_nodes=1, min_pod_age_seconds=3600)
    kw = {"blocked": set(), "empty_since": {}}
    started = {"old": 0.0, "young": 7500.0, "mover": 5000.0}
    assert plan(state, pods_on, prices, {}, rules, now=8000.0, started_at=started, **kw) == []
    plans = plan(state, pods_on, prices, {}, rules, now=9500.0, started_at=started, **kw)
    assert [(d.nodes, d.moves) for d in plans] == [((2,), {"mover": 0})]
    # without the age rule the pod may go beside either
    assert plan(state, pods_on, prices, {}, RULES, now=9500.0, **kw) != []


def test_with_at_most_0_evictions_per_pod_no_pod_moves_even_before_any_eviction() -> None:
    # the policy's maxEvictionsPerPod: 0 (pods whose work restarts): the mover of the test above stays put,
    # though no pod was ever evicted (an empty eviction record once skipped the cap)
    state, pods_on = _cluster([gpu_pod("old", 2)], [gpu_pod("young", 2)], [gpu_pod("mover")])
    prices = [T4X4.price_per_hour] * 3
    kw = {"blocked": set(), "empty_since": {}}
    assert plan(state, pods_on, prices, {}, RULES, now=9500.0, **kw) != []
    none = ConsolidationRules(max_disrupted_nodes=1, max_evictions_per_pod=0)
    assert plan(state, pods_on, prices, {}, none, now=9500.0, **kw) == []


def test_a_pod_is_never_moved_onto_a_node_dearer_per_gpu() -> None:
    # the pod of a T4x4 ($0.67 per GPU-hour) would fit on the V100x8 ($3.11): it stays; the other way it moves
    state = NodeState.build([T4X4.spec("t4-0"), V100X8.spec("v100-1")])
    t4_pod, v100_pod = gpu_pod("on-t4"), gpu_pod("on-v100", 6)
    state.place(0, t4_pod[1], (0,))
    state.place(1, v100_pod[1], tuple(range(6)))
    prices = [T4X4.price_per_hour, V100X8.price_per_hour]
    rules = ConsolidationRules(max_disrupted_nodes=1)
    plans = plan(state, {0: [t4_pod], 1: [v100_pod]}, prices, {}, rules, blocked=set(), now=0.0,
                             empty_since={})
    assert plans == []  # the V100's six GPUs fit nowhere; the T4's pod may not go to the V100
    small = NodeState.build([T4X4.spec("t4-0"), V100X8.spec("v100-1")])
    small.place(0, t4_pod[1], (0,))
    small.place(1, t4_pod[1], (0,))
    pods_on = {0: [t4_pod], 1: [("other", t4_pod[1])]}
    plans = plan(small, pods_on, prices, {}, rules, blocked=set(), now=0.0, empty_since={})
    assert [(d.nodes, d.moves) for d in plans] == [((1,), {"other": 0})]


def test_an_eight_gpu_node_kept_by_small_pods_is_replaced_by_several_smaller_nodes() -> None:
    # five 1-GPU pods on a V100x8 ($24.86/h): two T4x4 ($5.39/h) hold them; no single cheaper type does
    state = NodeState.build([V100X8.spec("v100-0")])
    pods = [gpu_pod(f"p{i}") for i in range(5)]
    for i, (_, d) in enumerate(pods):
        state.place(0, d, (i,))
    plans = plan(state, {0: pods}, [V100X8.price_per_hour], {}, RULES, blocked=set(), now=0.0,
                             empty_since={}, instance_types=TYPES)
    assert len(plans) == 1 and sorted(t.name for t in plans[0].launches) in (["t4x4", "t4x4"],
                                                                           ["p100x1", "t4x4"])
    assert plans[0].savings_per_hour > 15


def test_a_move_is_planned_only_where_the_scheduler_itself_would_put_the_pod() -> None:
    # the mover's node (t4-2) could empty onto t4-1's free GPU, but the packing engine, which places the
    # evicted pod as the scheduler will, picks the V100's last free GPU (dearer per GPU: a refused
    # destination). Hiding the V100 from the simulation planned a move the scheduler then did not make
    state = NodeState.build([V100X8.spec("v100-0"), T4X4.spec("t4-1"), T4X4.spec("t4-2")])
    big, mid, mover = gpu_pod("big", 7), gpu_pod("mid", 3), gpu_pod("mover")
    state.place(0, big[1], tuple(range(7)))
    state.place(1, mid[1], (0, 1, 2))
    state.place(2, mover[1], (0,))
    pods_on = {0: [big], 1: [mid], 2: [mover]}
    prices = [V100X8.price_per_hour, T4X4.price_per_hour, T4X4.price_per_hour]
    rules = ConsolidationRules(max_disrupted_nodes=1)
    kw = {"blocked": {0, 1}, "now": 0.0, "empty_since": {}}
    assert plan(state, pods_on, prices, {}, rules, **kw) == []
    full = state.copy()
    full.place(0, gpu_pod("last")[1], (7,))  # the V100 full: the engine's pick is t4-1, and the move is planned
    plans = plan(full, pods_on, prices, {}, rules, **kw)
    assert [(d.nodes, d.moves) for d in plans] == [((2,), {"mover": 1})]


def test_mig_nodes_count_their_gpus_and_slices_when_consolidating() -> None:
    """From Node and Pod objects, as the controller reads them: MIG nodes have GPU rows, so a slice is GPU
    used (1/7 of an A100 cut all-1g.10gb), their price per GPU is real, and freeing one frees its GPUs.
    mig-b's single slice (143 milli of GPU for $1/h) is the cheapest to move; it goes to the last free
    1g of mig-a's GPU 0, the fullest GPU with room."""
    from gpupolicy.packing.kubemodel import demand_from_pod, state_from_kubernetes
    from tests.cluster.objects import make_node, make_pod

    def slice_on(name: str, node: str, gpu: str) -> dict[str, object]:
        pod = make_pod(name, "ml", annotations={"gpu.kubeon.io/gpu-index": gpu}, gpus=1,
                       gpu_resource="nvidia.com/mig-1g.10gb", cpu="1", memory="4Gi")
        pod["spec"]["nodeName"] = node
        pod["status"] = {"phase": "Running"}
        return pod

    nodes = [make_node("mig-a", "NVIDIA-A100-SXM4-80GB", 2, mig={"1g.10gb": 7}),
             make_node("mig-b", "NVIDIA-A100-SXM4-80GB", 1, mig={"1g.10gb": 7})]
    pods = [slice_on(f"a{i}", "mig-a", "0") for i in range(6)] + [slice_on("b0", "mig-b", "0")]
    state = state_from_kubernetes(nodes, pods)
    assert state.gpu_count.tolist() == [2, 1] and state.gpu_free[:, :2].tolist() == [[142, 1000], [857, 0]]
    pods_on = {0: [(f"ml/a{i}", demand_from_pod(p)) for i, p in enumerate(pods[:6])],
               1: [("ml/b0", demand_from_pod(pods[6]))]}
    plans = plan(state, pods_on, [2.0, 1.0], {}, RULES, blocked=set(), now=0.0, empty_since={})
    assert [(d.method, d.nodes, d.moves) for d in plans] == [("single-node", (1,), {"ml/b0": 0})]
    assert plans[0].explanation == "mig-b: 1 pod; it fits on mig-a; frees 1 GPUs, about $1.00/h"
