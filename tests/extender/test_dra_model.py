"""The extender's model reads DRA state: ResourceSlices as GPU rows, ResourceClaim allocations as held devices.

Real: the extender's Flask app, `ExtenderService` and `ClusterCache` (fed by hand with objects shaped as
kube-apiserver serves them: the ResourceSlices of the NVIDIA DRA driver shim, tests/cluster/dra_driver.py,
and a claim's `status.allocation` as kube-scheduler's DynamicResources plugin writes it). The end-to-end
version, with the real scheduler allocating, is tests/e2e/test_dra_packing.py.
"""

from __future__ import annotations

from typing import Any

from gpupolicy.packing.kubemodel import demand_from_pod
from gpupolicy.packing.scheduling import PodRequest
from tests.cluster.dra_driver import resource_slice
from tests.cluster.objects import make_node
from tests.extender.payloads import Harness, bound, wire_pod

H200 = "NVIDIA-H200"
LAYOUT = ["1g.18gb"] * 7
MIG = "nvidia.com/mig-1g.18gb"


def claim_pod(name: str, template: str = "kubeon-mig-1g.18gb") -> dict[str, Any]:
    """A pod as the webhook rewrites it under a `via: DRA` policy (docs/designs/dra.md, "Pod")."""
    pod = wire_pod(name, gpus=0)
    pod["spec"]["resourceClaims"] = [{"name": "kubeon-claim-0", "resourceClaimTemplateName": template}]
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "kubeon-claim-0"}]
    return pod


def allocated(name: str, node: str, *devices: str) -> dict[str, Any]:
    """A ResourceClaim as kube-scheduler leaves it once allocated (resource.k8s.io/v1)."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "status": {"allocation": {
                "devices": {"results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": node, "device": d}
                                        for d in devices]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}}


def dra_harness(*names: str) -> Harness:
    """DRA nodes: no `nvidia.com/gpu` advertised (no device plugin), one H200 cut into 7x 1g.18gb each."""
    harness = Harness(nodes=[make_node(n, None) for n in names])
    for n in names:
        harness.cache.on_slice("ADDED", resource_slice(n, H200, 1, LAYOUT))
    return harness


def free_devices(harness: Harness, node: str) -> int:
    with harness.cache.lock:
        state = harness.cache.fresh_state()
        return int(state.mig_free[state.index[node], state.mig_resources.index(MIG)])


def test_a_claim_pod_asks_what_its_template_names() -> None:
    demand = demand_from_pod(claim_pod("p"))
    assert dict(demand.mig) == {MIG: 1} and demand.num_gpu == 0
    whole = demand_from_pod(claim_pod("w", "kubeon-gpu-2-0123abcd"))
    assert whole.num_gpu == 2 and whole.gpu_milli == 1000
    mine = demand_from_pod(claim_pod("m", "someone-elses"))  # not ours: nothing known of its devices
    assert not mine.mig and not mine.num_gpu


def test_slices_are_gpu_rows_and_allocations_hold_the_device_the_scheduler_chose() -> None:
    harness = dra_harness("a")
    assert free_devices(harness, "a") == 7
    harness.cache.on_claim("MODIFIED", allocated("c1", "a", "gpu-0-mig-1g18gb-3"))
    assert free_devices(harness, "a") == 6
    harness.cache.on_pod("MODIFIED", bound(claim_pod("p1"), "a"))  # the pod itself holds no second device
    assert free_devices(harness, "a") == 6
    harness.cache.on_claim("MODIFIED", {**allocated("c1", "a"), "status": {}})  # deallocated
    assert free_devices(harness, "a") == 7
    harness.cache.on_claim("MODIFIED", allocated("c2", "a", "gpu-0-mig-1g18gb-0"))
    harness.cache.on_claim("DELETED", allocated("c2", "a", "gpu-0-mig-1g18gb-0"))
    assert free_devices(harness, "a") == 7


def test_the_claim_pod_is_scored_onto_the_partly_used_node() -> None:
    harness = dra_harness("a", "b")
    harness.cache.on_claim("ADDED", allocated("c1", "b", "gpu-0-mig-1g18gb-0"))
    assert harness.schedule(claim_pod("next"), ["a", "b"]) == "b"
    harness.cache.on_claim("DELETED", allocated("c1", "b"))
    harness.cache.on_claim("ADDED", allocated("c2", "a", "gpu-0-mig-1g18gb-5"))
    assert harness.schedule(claim_pod("other"), ["a", "b"]) == "a"


def test_a_claim_pod_fits_no_node_without_a_free_device_of_its_profile() -> None:
    harness = dra_harness("a")
    for i in range(7):
        harness.cache.on_claim("ADDED", allocated(f"c{i}", "a", f"gpu-0-mig-1g18gb-{i}"))
    assert harness.filter(claim_pod("late"), ["a"])["NodeNames"] == []


def test_a_malformed_slice_is_left_out_and_named() -> None:
    harness = dra_harness("a")
    broken = resource_slice("a", H200, 1, LAYOUT)
    broken["spec"]["devices"][0]["capacity"]["memory"]["value"] = "lots"
    harness.cache.on_slice("MODIFIED", broken)
    assert free_devices_or_none(harness, "a") is None
    problem = harness.cache.ignored.current("resourceslice")["a-gpu.nvidia.com"]
    assert "spec.devices[0].capacity.memory: not a memory quantity: 'lots'" in problem, problem


def free_devices_or_none(harness: Harness, node: str) -> int | None:
    with harness.cache.lock:
        state = harness.cache.fresh_state()
        if MIG not in state.mig_resources:
            return None
        return int(state.mig_free[state.index[node], state.mig_resources.index(MIG)])


def test_a_slice_deleted_takes_its_devices_out_of_the_model() -> None:
    harness = dra_harness("a", "b")
    harness.cache.on_slice("DELETED", resource_slice("a", H200, 1, LAYOUT))
    assert free_devices_or_none(harness, "b") == 7
    assert free_devices(harness, "a") == 0  # a node without DRA devices: no row of the profile


def shared_pod(name: str, claim: str = "kubeon-ts-chat-0") -> dict[str, Any]:
    """A pod as the webhook rewrites it under a TimeSlicing `via: DRA` policy: its one GPU is a share of the
    shared ResourceClaim it names (docs/designs/dra.md, "Time-slicing through one shared claim")."""
    pod = wire_pod(name, gpus=0)
    pod["spec"]["resourceClaims"] = [{"name": "kubeon-claim-0", "resourceClaimName": claim}]
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "kubeon-claim-0"}]
    return pod


def whole_harness(*names: str) -> Harness:
    """DRA nodes with two whole H200s each (no MIG)."""
    harness = Harness(nodes=[make_node(n, None) for n in names])
    for n in names:
        harness.cache.on_slice("ADDED", resource_slice(n, H200, 2))
    return harness


def free_gpus(harness: Harness, node: str) -> int:
    with harness.cache.lock:
        state = harness.cache.fresh_state()
        return int(state.full_count[state.index[node]])


def test_a_pending_shared_claim_pod_asks_for_the_whole_gpu_its_claim_will_take() -> None:
    demand = demand_from_pod(shared_pod("p"))
    assert (demand.num_gpu, demand.gpu_milli, dict(demand.mig)) == (1, 1000, {})
    pinned = PodRequest.parse(shared_pod("q"), lambda claim: claim == "default/kubeon-ts-chat-0").demand
    assert (pinned.num_gpu, pinned.gpu_milli) == (0, 0)  # its allocated claim holds the GPU


def test_a_shared_claim_pod_is_scored_onto_the_node_with_a_gpu_taken_and_its_claim_holds_one_gpu() -> None:
    harness = whole_harness("a", "b")
    harness.cache.on_claim("ADDED", allocated("other", "b", "gpu-0"))
    assert harness.schedule(shared_pod("first"), ["a", "b"]) == "b"
    harness.cache.on_claim("ADDED", allocated("kubeon-ts-chat-0", "b", "gpu-1"))
    for i in range(3):  # the claim's pods hold nothing more than the claim's one GPU
        harness.cache.on_pod("MODIFIED", bound(shared_pod(f"p{i}"), "b"))
    assert free_gpus(harness, "b") == 0 and free_gpus(harness, "a") == 2


def test_a_pod_of_an_allocated_claim_passes_its_full_node_and_one_of_a_new_claim_does_not() -> None:
    """kube-scheduler's DynamicResources filter keeps a pod of an allocated claim on the claim's node (the
    allocation's nodeSelector); the extender does not repeat it, and must not refuse that node as full."""
    harness = whole_harness("a")
    harness.cache.on_claim("ADDED", allocated("kubeon-ts-chat-0", "a", "gpu-0"))
    harness.cache.on_claim("ADDED", allocated("other", "a", "gpu-1"))
    assert harness.filter(shared_pod("late"), ["a"])["NodeNames"] == ["a"]
    assert harness.filter(shared_pod("new", "kubeon-ts-chat-1"), ["a"])["NodeNames"] == []
