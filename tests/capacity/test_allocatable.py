"""What a launched node of an instance type offers (gpupolicy/capacity/allocatable.py): read from nodes and
NodeClaims, and what provisioning plans with it."""

from __future__ import annotations

from typing import Any

from gpupolicy.capacity.allocatable import free_on, held_nowhere, observed, offered
from gpupolicy.capacity.instances import InstanceType
from gpupolicy.capacity.provider import CapacityNode
from gpupolicy.capacity.provisioning import plan_launches
from gpupolicy.packing.nodemodel import NodeState, PodDemand

L4 = InstanceType("g6.xlarge", "NVIDIA-L4", 1, 4000, 16384, 0.8048)
L4_2X = InstanceType("g6.2xlarge", "NVIDIA-L4", 1, 8000, 32768, 0.9776)


def node(kind: str | None, cpu: Any, memory: Any) -> dict[str, Any]:
    labels = {"node.kubernetes.io/instance-type": kind} if kind else {}
    return {"metadata": {"name": f"n-{kind}-{cpu}", "labels": labels},
            "status": {"allocatable": {"cpu": cpu, "memory": memory, "nvidia.com/gpu": "1"}}}


def claim(kind: str, allocatable: dict[str, str]) -> CapacityNode:
    return CapacityNode(claim=f"c-{kind}", node=None, pool="gpu", instance_type=kind, gpus=1, product="NVIDIA-L4",
                        price_per_hour=0.8, allocatable=allocatable)


def test_the_least_cpu_and_memory_seen_per_type_from_nodes_and_launched_claims() -> None:
    seen = observed([node("g6.xlarge", "3920m", "16000Mi"), node("g6.xlarge", "4", "15Gi")],
                    [claim("g6.xlarge", {"cpu": "3900m", "memory": "16374Mi"}), claim("g5.xlarge", {})],
                    {"g6.xlarge", "g5.xlarge"})
    assert seen == {"g6.xlarge": (3900, 15360)}  # a claim not launched yet (no allocatable) says nothing


def test_a_node_without_a_type_or_with_an_unreadable_allocatable_says_nothing() -> None:
    assert observed([node(None, "3", "8Gi"), node("g6.xlarge", "three", "8Gi"), node("g6.xlarge", "3", None),
                     node("m5.large", "2", "8Gi")], [], {"g6.xlarge"}) == {}  # m5.large: not in the catalog


def test_offered_lowers_a_seen_type_to_its_allocatable_and_leaves_the_others() -> None:
    out = offered([L4, L4_2X], {"g6.xlarge": (3900, 16374), "g6.2xlarge": (9000, 40000)})
    assert (out[0].cpu_milli, out[0].memory_mib) == (3900, 16374)
    assert out[1] is L4_2X  # never raised above the catalog's capacity


def test_a_pod_asking_a_types_whole_cpu_is_planned_on_a_larger_type_once_the_smaller_ones_allocatable_is_seen(
) -> None:
    pod = [("ns/whole-cpu", PodDemand(cpu_milli=4000, memory_mib=8192, num_gpu=1, gpu_milli=1000))]
    empty = NodeState.build([])
    [by_capacity] = plan_launches(pod, empty, [], [L4, L4_2X])
    assert by_capacity.instance_type.name == "g6.xlarge"
    [by_allocatable] = plan_launches(pod, empty, [], offered([L4, L4_2X], {"g6.xlarge": (3900, 16374)}))
    assert by_allocatable.instance_type.name == "g6.2xlarge"


def test_a_node_has_its_allocatable_less_its_pods_requests_free_and_a_pod_larger_than_every_room_is_held_nowhere(
) -> None:
    running = [{"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1500m",
                                                                                  "memory": "2Gi"}}}]}}]
    assert free_on(node("g6.xlarge", "3900m", "16374Mi"), running) == (2400, 14326)
    asking = {"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "2500m", "memory": "1Gi"}}}]}}
    assert held_nowhere(asking, [(2400, 14326), (3900, 512)])  # CPU short on one, memory on the other
    assert not held_nowhere(asking, [(2400, 14326), (3900, 1024)])
