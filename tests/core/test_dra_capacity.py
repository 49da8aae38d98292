"""The capacity planner reads DRA: a pod claiming through our template asks for the device it names, a node's
ResourceSlices are what it offers (issue 42; the end-to-end test is tests/controller/test_capacity_dra_cluster.py)."""

from __future__ import annotations

from typing import Any

from gpupolicy.capacity.layout import plan_layout, read_demand, read_nodes
from gpupolicy.model import parse_policy
from tests.cluster.dra_driver import resource_slice
from tests.cluster.objects import make_node, make_pod

A100 = "NVIDIA-A100-SXM4-80GB"


def claim_pod(name: str, template: str = "kubeon-mig-1g.10gb", node: str | None = None) -> dict[str, Any]:
    pod = make_pod(name, "default")
    pod["spec"]["resourceClaims"] = [{"name": "kubeon-claim-0", "resourceClaimTemplateName": template}]
    if node:
        pod["spec"]["nodeName"] = node
        pod["status"] = {"phase": "Running"}
    return pod


def unserved(nodes: list[dict[str, Any]], pods: list[dict[str, Any]], slices: list[dict[str, Any]]) -> list[str]:
    plan = plan_layout(read_nodes(nodes, pods, {}, slices=slices), read_demand(pods, []))
    return sorted(pod for pod, _ in plan.unserved)


def test_a_claim_pod_waits_for_the_device_its_template_names() -> None:
    [demand] = read_demand([claim_pod("p")], [])
    assert (demand.resource, demand.count, demand.pending) == ("nvidia.com/mig-1g.10gb", 1.0, True)


def test_a_dra_node_with_a_free_device_serves_it_and_a_full_one_does_not() -> None:
    node = make_node("dra", None)  # no device plugin: its GPUs are in its slice only
    slices = [resource_slice("dra", A100, 1, ["1g.10gb"] * 7)]
    [gpu_node] = read_nodes([node], [], {}, slices=slices)
    assert (gpu_node.gpus, gpu_node.offers, gpu_node.product and gpu_node.product.product) == (
        1, {"nvidia.com/mig-1g.10gb": 7.0}, A100)
    assert unserved([node], [claim_pod("p")], slices) == []
    full = [claim_pod(f"b{i}", node="dra") for i in range(7)]
    assert unserved([node], [*full, claim_pod("p")], slices) == ["default/p"]
    assert unserved([node], [claim_pod("p")], []) == ["default/p"]  # no slice, no device


def test_consolidation_state_sees_dra_devices_and_what_bound_claim_pods_hold() -> None:
    """The state consolidation and drains plan on (`state_from_kubernetes`): a DRA node's devices are rows,
    and a bound claim pod holds its device, so a node full of them never looks empty."""
    from gpupolicy.packing.kubemodel import state_from_kubernetes

    node = make_node("dra", None)
    slices = [resource_slice("dra", A100, 1, ["1g.10gb"] * 7)]
    pods = [claim_pod(f"b{i}", node="dra") for i in range(3)]
    state = state_from_kubernetes([node], pods, slices=slices)
    resource = state.mig_resources.index("nvidia.com/mig-1g.10gb")
    assert (int(state.gpu_count[0]), int(state.mig_free[0, resource])) == (1, 4)


def test_a_claim_pod_a_free_dra_device_serves_asks_for_no_relayout() -> None:
    """The layout reconciler plans on the same offers. A DRA node (GFD labels, no device plugin) whose slice
    lists free 1g.10gb devices serves a pending 1g.10gb claim pod as it is; read without its slice it looks
    like an empty whole-GPU node, and would be re-laid all-1g.10gb for the pod."""
    policy = parse_policy({"apiVersion": "gpu.kubeon.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "m"},
                           "spec": {"sharing": {"strategy": "MIG", "via": "DRA", "gpuModels": [A100]}}})
    node = make_node("dra", A100, 1)
    node["status"]["allocatable"] = {k: v for k, v in node["status"]["allocatable"].items()
                                     if not k.startswith("nvidia.com/")}
    slices = [resource_slice("dra", A100, 1, ["1g.10gb"] * 7)]
    pods = [claim_pod("p")]
    with_slice = plan_layout(read_nodes([node], pods, {}, slices=slices), read_demand(pods, [policy]))
    assert (with_slice.targets, with_slice.matched) == ((), 1)
    [target] = plan_layout(read_nodes([node], pods, {}), read_demand(pods, [policy])).targets
    assert target.target.mig == "all-1g.10gb"


def shared_pod(name: str, claim: str = "kubeon-ts-chat-0", node: str | None = None) -> dict[str, Any]:
    """A pod naming a shared claim (TimeSlicing `via: DRA`, docs/designs/dra.md)."""
    pod = make_pod(name, "default")
    pod["spec"]["resourceClaims"] = [{"name": "kubeon-claim-0", "resourceClaimName": claim}]
    if node:
        pod["spec"]["nodeName"] = node
        pod["status"] = {"phase": "Running"}
    return pod


def test_a_burst_on_one_unallocated_shared_claim_asks_for_one_gpu() -> None:
    pods = [shared_pod(f"p{i}") for i in range(4)] + [shared_pod("q", "kubeon-ts-chat-1")]
    demands = read_demand(pods, [])
    assert [(d.pod, d.resource, d.count) for d in demands] == [
        ("default/p0", "nvidia.com/gpu", 1.0), ("default/q", "nvidia.com/gpu", 1.0)]


def test_an_allocated_shared_claim_pins_its_pending_pods_and_holds_one_gpu() -> None:
    node = make_node("dra", None)
    slices = [resource_slice("dra", A100, 2)]
    pods = [shared_pod("b0", node="dra"), shared_pod("b1", node="dra"), shared_pod("late")]
    assert read_demand(pods, []) == []  # its claim is allocated (a pod of it is bound): no launch for it
    assert unserved([node], [*pods, shared_pod("n0", "kubeon-ts-chat-1")], slices) == []  # one GPU left
    other = [shared_pod("o0", "kubeon-ts-other-0", node="dra")]
    assert unserved([node], [*pods, *other, shared_pod("n0", "kubeon-ts-chat-1")], slices) == ["default/n0"]


def test_consolidation_state_counts_a_shared_claim_gpu_once() -> None:
    from gpupolicy.packing.kubemodel import state_from_kubernetes

    node = make_node("dra", None)
    pods = [shared_pod(f"b{i}", node="dra") for i in range(3)]
    state = state_from_kubernetes([node], pods, slices=[resource_slice("dra", A100, 2)])
    assert (int(state.gpu_count[0]), int(state.full_count[0])) == (2, 1)
